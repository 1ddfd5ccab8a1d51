"""SparkSession for eosink's jobs, with the Kafka jars and our packages on the executors.

Python workers must import ``eosink.spark_jobs`` (and ``eosink.connectors``, for the error classes)
to run the publisher's task function. Where eosink is installed in the interpreter the executors
run (``PYSPARK_PYTHON``, the driver's own by default, as with every local master) nothing is
shipped; otherwise ``build_session`` ships a zip of both packages under their ``eosink.`` names
(``addPyFile``), e.g. for ``spark-submit --master yarn``.
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

import eosink.spark_jobs

_SOURCE_ROOT = Path(eosink.spark_jobs.__file__).resolve().parent.parent
_SHIPPED: set[int] = set()

#: Spark 4 caps each Arrow batch it hands to Python by bytes as well as by rows, and enforces the byte cap (64 MB by
#: default) by measuring the batch's vectors after every row it adds (``ArrowWriter.sizeInBytes`` in
#: ``BatchedPythonArrowInput``): 0.3-0.5 us of the 2.6-3.2 us of CPU per row the batch publisher's JVM spent, measured
#: side by side. Only ``Int.MaxValue`` turns the check off. A publisher's batches are bounded by their row count anyway
#: (``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 by default) and its records by Kafka's message size.
ARROW_MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
ARROW_NO_BYTE_CAP = str(2**31 - 1)


def uncap_arrow_batches(spark: SparkSession) -> None:
    """Bound ``spark``'s Arrow batches to Python by their row count only (see :data:`ARROW_MAX_BYTES`), unless a byte
    cap was set explicitly (it is then kept)."""
    jconf = getattr(spark.conf, "_jconf", None)  # (a Spark Connect session has none: its server's settings apply)
    if jconf is not None and not jconf.contains(ARROW_MAX_BYTES):
        spark.conf.set(ARROW_MAX_BYTES, ARROW_NO_BYTE_CAP)


def _executors_import_eosink(master: str) -> bool:
    """Local executors are children of this driver and run ``PYSPARK_PYTHON``: when that is this
    interpreter, they import the eosink installed here (a wheel or an editable install)."""
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    return master.startswith("local") and os.path.realpath(python) == os.path.realpath(sys.executable)


def ship_packages(spark: SparkSession) -> None:
    """Make ``eosink.spark_jobs`` and ``eosink.connectors`` importable on every executor (once per context)."""
    sc = spark.sparkContext
    # a started context always has a master; without one, ship (the safe side)
    if id(sc) in _SHIPPED or (sc.master is not None and _executors_import_eosink(sc.master)):
        return
    archive = Path(tempfile.mkdtemp(prefix="eosink-pyfiles-")) / "eosink_spark_packages.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("eosink/__init__.py", "")
        for pkg in ("spark_jobs", "connectors"):
            for f in (_SOURCE_ROOT / pkg).rglob("*"):
                if f.is_file() and "__pycache__" not in f.parts:
                    zf.write(f, Path("eosink") / f.relative_to(_SOURCE_ROOT))
    sc.addPyFile(str(archive))
    _SHIPPED.add(id(sc))


def build_session(
    app_name: str = "eosink",
    *,
    master: str | None = None,
    kafka_jars: bool = False,
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """``getOrCreate`` a session. ``kafka_jars`` adds spark-sql-kafka and spark-avro (resolved with Maven)
    for reading Kafka topics, Spark's own Kafka sink, and ``Outbox(format="avro")`` (whose ``to_avro`` is
    spark-avro's); the publisher itself needs no jar for JSON values."""
    # Under spark-submit the JVM already runs (PYSPARK_GATEWAY_PORT); otherwise this process
    # launches it now and the JVM, and the Python workers it forks, inherit our environment.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings: dict[str, Any] = {"spark.sql.session.timeZone": "UTC", ARROW_MAX_BYTES: ARROW_NO_BYTE_CAP}
    if kafka_jars:
        from eosink.spark_jobs.jars import resolve_jars

        settings["spark.jars"] = ",".join(str(p) for p in resolve_jars())
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, str(v))
    spark = builder.getOrCreate()
    ship_packages(spark)
    from eosink.spark_jobs.datasource import register

    register(spark)  # format("eosink")
    return spark
