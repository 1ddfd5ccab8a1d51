"""What a Python worker pays around every task: zips re-read only when changed, startup objects frozen."""

from __future__ import annotations

import importlib
import json
import sys
import zipfile
import zipimport
from pathlib import Path

import pytest

from eosink.spark_jobs import worker_overheads

lazy_already = pytest.mark.skipif(sys.version_info >= (3, 12), reason="the interpreter's zipimporter is lazy already")


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


@lazy_already
def test_unchanged_pyspark_zip_is_not_reread_before_every_task(zipped_path: Path, monkeypatch):
    assert importlib.import_module("eosink_zc_one").VALUE == 1
    assert worker_overheads.lazy_zip_caches() >= 1
    finder = sys.path_importer_cache[str(zipped_path)]
    assert isinstance(finder, worker_overheads.ChangedOnlyZipImporter)
    reads = []
    real = zipimport._read_directory  # type: ignore[attr-defined]
    monkeypatch.setattr(zipimport, "_read_directory", lambda archive: reads.append(archive) or real(archive))
    for _ in range(5):
        importlib.invalidate_caches()  # what PySpark's worker does at the start of every task
    assert reads == [], "an unchanged archive was read again"
    assert worker_overheads.lazy_zip_caches() == 0, "installing twice changes nothing"


@lazy_already
def test_a_zip_replaced_under_the_same_name_is_still_seen(zipped_path: Path):
    importlib.import_module("eosink_zc_one")
    worker_overheads.lazy_zip_caches()
    with zipfile.ZipFile(zipped_path, "a") as zf:
        zf.writestr("eosink_zc_two.py", "VALUE = 2\n")
    importlib.invalidate_caches()
    assert importlib.import_module("eosink_zc_two").VALUE == 2


def test_objects_alive_at_the_first_task_are_not_walked_by_each_later_collection():
    import subprocess

    code = (
        "import gc, json\n"
        "from eosink.spark_jobs import worker_overheads as w\n"
        "before = gc.get_freeze_count()\n"
        "first, again = w.freeze_startup_objects(), w.freeze_startup_objects()\n"
        "print(json.dumps([before, gc.get_freeze_count(), first, again]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, frozen, first, again = json.loads(out)
    assert before == 0 and frozen > 1_000, "the imports were not frozen"
    assert (first, again) == (True, False), "frozen more than once in one process"
