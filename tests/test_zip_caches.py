"""The Python worker's zip importers: re-read on ``invalidate_caches`` only when the archive changed."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport
from pathlib import Path

import pytest

from eosink.spark_jobs import zip_caches

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="the interpreter's zipimporter is lazy already")


@pytest.fixture
def zipped_path(tmp_path, monkeypatch):
    archive = tmp_path / "shipped.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("eosink_zc_one.py", "VALUE = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    importlib.invalidate_caches()
    yield archive
    for name in ("eosink_zc_one", "eosink_zc_two"):
        sys.modules.pop(name, None)
    sys.path_importer_cache.pop(str(archive), None)


def test_unchanged_pyspark_zip_is_not_reread_before_every_task(zipped_path: Path, monkeypatch):
    assert importlib.import_module("eosink_zc_one").VALUE == 1
    assert zip_caches.install() >= 1
    finder = sys.path_importer_cache[str(zipped_path)]
    assert isinstance(finder, zip_caches.ChangedOnlyZipImporter)
    reads = []
    real = zipimport._read_directory  # type: ignore[attr-defined]
    monkeypatch.setattr(zipimport, "_read_directory", lambda archive: reads.append(archive) or real(archive))
    for _ in range(5):
        importlib.invalidate_caches()  # what PySpark's worker does at the start of every task
    assert reads == [], "an unchanged archive was read again"
    assert zip_caches.install() == 0, "installing twice changes nothing"


def test_a_zip_replaced_under_the_same_name_is_still_seen(zipped_path: Path):
    importlib.import_module("eosink_zc_one")
    zip_caches.install()
    with zipfile.ZipFile(zipped_path, "a") as zf:
        zf.writestr("eosink_zc_two.py", "VALUE = 2\n")
    importlib.invalidate_caches()
    assert importlib.import_module("eosink_zc_two").VALUE == 2
