"""Installs the repository's top-level folders under one namespace.

``worker/``, ``connectors/`` and ``spark_jobs/`` stay where the product's layout puts them, but
install (wheel and editable alike) as ``eosink.worker``, ``eosink.connectors`` and
``eosink.spark_jobs``: ``worker`` and ``connectors`` are other projects' names on PyPI.
Everything else is declared in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

ROOTS = ("worker", "connectors", "spark_jobs")

setup(
    packages=["eosink." + p for p in find_packages(include=[f"{r}*" for r in ROOTS])],
    package_dir={f"eosink.{r}": r for r in ROOTS},
)
