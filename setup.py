"""Installs the repository's top-level folders under one namespace.

``worker/``, ``connectors/`` and ``spark_jobs/`` stay where the product's layout puts them, but
install (wheel and editable alike) as ``eosink.worker``, ``eosink.connectors`` and
``eosink.spark_jobs``: ``worker`` and ``connectors`` are other projects' names on PyPI.
Everything else is declared in ``pyproject.toml``, but for the C extensions, all optional - without
a C compiler the package installs without them and the same work is done in Python: the Spark
publisher's produce loop (``spark_jobs/native``), the worker's Avro row decoder (``worker/native``) and the
PostgreSQL sink's JSON-to-binary-COPY row encoder (``connectors/postgres/_copy_rows.c``), the Iceberg
sink's JSON-to-Arrow column parser (``connectors/iceberg/_json_columns.c``) and the JSON Lines body of
values copied from the topic (``connectors/common/_batches.c``).
"""

import os

from setuptools import Extension, find_namespace_packages, setup

ROOTS = ("worker", "connectors", "spark_jobs")
NATIVE = {"eosink.spark_jobs.native._produce": "spark_jobs/native/produce.c",
          "eosink.worker.native._avro_rows": "worker/native/_avro_rows.c",
          "eosink.worker.native._records": "worker/native/_records.c",
          "eosink.connectors.postgres._copy_rows": "connectors/postgres/_copy_rows.c",
          "eosink.connectors.common._batches": "connectors/common/_batches.c",
          "eosink.connectors.iceberg._json_columns": "connectors/iceberg/_json_columns.c"}

#: The JSON scanning both value parsers include.
JSON_SCAN = "connectors/common/_json_scan.h"

setup(
    # Namespace discovery, so the data-only folders (the jvm/ poms) are declared packages too: with plain
    # find_packages setuptools found them importable but undeclared and warned once per folder at install.
    packages=["eosink." + p for p in find_namespace_packages(include=[f"{r}*" for r in ROOTS], exclude=["*__pycache__"])],
    package_dir={f"eosink.{r}": r for r in ROOTS},
    # (Absent while a container build installs the dependencies from the metadata alone.)
    ext_modules=[Extension(name, [src], optional=True, extra_compile_args=["-O2"], depends=[JSON_SCAN])
                 for name, src in NATIVE.items() if os.path.exists(src)],
)
