"""Packaging: the repository's folders install as one ``eosink`` namespace, editable and as a wheel.

``worker`` and ``connectors`` are other projects' names on PyPI, so nothing may install them as
top-level packages; a user's plugin imports ``eosink.connectors.api``. A worker installs without
PySpark (the ``spark`` extra), so no worker or connector module may import it.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.procs import REPO

PACKAGES = ("worker", "connectors", "spark_jobs")


def _run(code: str, *, env: dict[str, str] | None = None, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], cwd="/", env=env,
                          capture_output=True, text=True, timeout=120)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_editable_install_imports_the_checkout_under_eosink_and_installs_no_top_level_worker():
    r = _run("""
        import importlib.util, json
        import eosink.connectors.api, eosink.worker.engine.task, eosink.spark_jobs.naming
        print(json.dumps({
            "api": eosink.connectors.api.__file__,
            "task": eosink.worker.engine.task.__file__,
            "top_level": [m for m in ("worker", "connectors", "spark_jobs") if importlib.util.find_spec(m)],
        }))
    """, env=_clean_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["api"] == str(REPO / "connectors" / "api" / "__init__.py")
    assert out["task"] == str(REPO / "worker" / "engine" / "task.py")
    assert out["top_level"] == [], "a top-level package would shadow (or be shadowed by) another project's"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout (a build leaves build/ and egg-info behind)."""
    src = tmp_path_factory.mktemp("src") / "eosink"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", ".eosink", "build", "*.egg-info",
                                                             "__pycache__", "results"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("eosink-*.whl")
    return whl


def test_wheel_holds_every_module_and_resource_under_eosink_only(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"eosink"}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            assert "eosink/" + f.relative_to(REPO).as_posix() in names, f"{f} is missing from the wheel"
    for pom in ("eosink/worker/stack/jvm/kafka/pom.xml", "eosink/connectors/jvm/iceberg-spark/pom.xml",
                "eosink/spark_jobs/jvm/pom.xml"):
        assert pom in names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    script = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["eosink"]
    assert f"eosink = {script}" in text and script.startswith("eosink.")
    (license_file,) = [n for n in names if n.endswith("/LICENSE")]
    assert b"Apache License" in zipfile.ZipFile(wheel).read(license_file)


def test_wheel_installed_alone_imports_and_runs_its_command_line(wheel, tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # -S: no site processing, so the editable install's finder (a .pth file) is not loaded; the
    # virtualenv's site-packages still provide the third-party dependencies.
    deps = os.pathsep.join(site.getsitepackages())
    env = {**_clean_env(), "PYTHONPATH": os.pathsep.join([str(target), deps])}
    r = _run("""
        import json, sys
        import eosink.worker.clients.cli as cli, eosink.connectors.api as api
        from eosink.connectors.api import TwoPhaseCommitSink
        try:
            cli.main(["--version"])
        except SystemExit as e:
            code = e.code
        print(json.dumps({"cli": cli.__file__, "api": api.__file__, "code": code}))
    """, env=env, flags=("-S",))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cli"].startswith(str(target)) and out["api"].startswith(str(target))
    assert out["code"] in (0, None)


def test_worker_and_connectors_import_without_pyspark():
    """What a worker image runs (the ``worker`` extra) must not need the ``spark`` extra."""
    r = _run("""
        import importlib, importlib.abc, pkgutil, sys

        class NoSpark(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "pyspark" or name.startswith("pyspark."):
                    raise ImportError(f"{name} is not installed (blocked)")
                return None

        sys.meta_path.insert(0, NoSpark())
        import eosink.worker, eosink.connectors
        failed = []
        for pkg in (eosink.worker, eosink.connectors):
            for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                if info.name.endswith(".__main__"):
                    continue
                try:
                    importlib.import_module(info.name)
                except ImportError as e:
                    failed.append(f"{info.name}: {e}")
        from eosink.worker.clients.cli import main
        try:
            main(["worker", "--help"])
        except SystemExit:
            pass
        assert not failed, failed
        assert "pyspark" not in sys.modules
    """, env=_clean_env())
    assert r.returncode == 0, r.stderr[-3000:]
