"""SparkSession for eosink's jobs, with the Kafka jars and our packages on the executors.

Python workers must import ``spark_jobs`` (and ``connectors``, for the error classes) to run the
publisher's task function. An installed eosink (``pip install``) is importable anyway; from a source
checkout, ``build_session`` puts the checkout on the workers' ``PYTHONPATH`` for local masters and
ships a zip of both packages (``addPyFile``) for anything else, e.g. ``spark-submit --master yarn``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

import spark_jobs

_SOURCE_ROOT = Path(spark_jobs.__file__).resolve().parent.parent
_SHIPPED: set[int] = set()


def _installed() -> bool:
    return "site-packages" in Path(spark_jobs.__file__).resolve().parts


def _prepend_pythonpath(path: Path) -> None:
    current = os.environ.get("PYTHONPATH", "")
    parts = [p for p in current.split(os.pathsep) if p]
    if str(path) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(path), *parts])


def ship_packages(spark: SparkSession, *, on_pythonpath: bool = False) -> None:
    """Make ``spark_jobs`` and ``connectors`` importable on every executor (once per context).

    ``on_pythonpath``: the checkout was on ``PYTHONPATH`` when this process launched the JVM, so
    local-mode workers (children of that JVM) already import it.
    """
    sc = spark.sparkContext
    if _installed() or id(sc) in _SHIPPED:
        return
    if on_pythonpath and sc.master.startswith("local"):
        _SHIPPED.add(id(sc))
        return
    archive = Path(tempfile.mkdtemp(prefix="eosink-pyfiles-")) / "eosink_spark_packages.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in ("spark_jobs", "connectors"):
            for f in (_SOURCE_ROOT / pkg).rglob("*"):
                if f.is_file() and "__pycache__" not in f.parts:
                    zf.write(f, f.relative_to(_SOURCE_ROOT))
    sc.addPyFile(str(archive))
    _SHIPPED.add(id(sc))


def build_session(
    app_name: str = "eosink",
    *,
    master: str | None = None,
    kafka_jars: bool = False,
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """``getOrCreate`` a session. ``kafka_jars`` adds spark-sql-kafka (resolved with Maven) for
    reading Kafka topics or Spark's own Kafka sink; the publisher itself needs no jar."""
    from pyspark import SparkContext

    # Under spark-submit the JVM already runs (PYSPARK_GATEWAY_PORT); otherwise this process
    # launches it now and the JVM, and the Python workers it forks, inherit our environment.
    launches_jvm = "PYSPARK_GATEWAY_PORT" not in os.environ and SparkContext._active_spark_context is None
    on_pythonpath = False
    if not _installed() and launches_jvm:
        _prepend_pythonpath(_SOURCE_ROOT)
        on_pythonpath = True
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings: dict[str, Any] = {"spark.sql.session.timeZone": "UTC"}
    if kafka_jars:
        from spark_jobs.jars import resolve_jars

        settings["spark.jars"] = ",".join(str(p) for p in resolve_jars())
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, str(v))
    spark = builder.getOrCreate()
    ship_packages(spark, on_pythonpath=on_pythonpath)
    return spark
