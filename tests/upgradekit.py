"""A released eosink, built from its commit, run beside the checkout's code in the same interpreter.

The release is pinned by its commit (``RELEASE_COMMIT``) as well as named by its tag: a tag does not
travel everywhere a clone does, a commit of main's history does. Its wheel is built from
``git archive`` of that commit (with the release's own ``constraints.txt`` for the build) and unpacked
into a directory of its own, cached under ``~/.cache/eosink/releases/<commit>``. A worker runs the
release with that directory first on ``PYTHONPATH``: every ``eosink`` module it imports is the
release's, and the dependencies are the checkout's, which the release accepts (the version policy
keeps dependency ranges compatible within a minor series; docs/operations/upgrades.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEASE = "v0.1.0"
RELEASE_VERSION = "0.1.0"
RELEASE_COMMIT = "916e3206070f25da0497a4a5511aa3a84e87bf4c"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eosink" / "releases"


def release_site(commit: str = RELEASE_COMMIT) -> Path:
    """The directory holding the release's ``eosink`` package (built on first use, ~10 s)."""
    site = CACHE / commit / "site"
    if (site / ".complete").exists():
        return site
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp)
        src, dist, out = work / "src", work / "dist", work / "site"
        src.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True, check=False)
        if archive.returncode != 0:
            raise RuntimeError(f"git archive {commit} ({RELEASE}) failed: {archive.stderr.decode()[-400:]}")
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
        env = {**os.environ, "PIP_CONSTRAINT": str(src / "constraints.txt")}
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), "./src"], work, env)
        wheels = list(dist.glob("eosink-*.whl"))
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(out), *map(str, wheels)], work, env)
        (out / ".complete").write_text(commit + "\n")
        site.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(site, ignore_errors=True)
        out.rename(site)
    return site


def release_worker(commit: str = RELEASE_COMMIT) -> dict[str, object]:
    """What makes a :class:`~tests.procs.WorkerProcess` run the release: its package first on the path,
    and a working directory outside the checkout, whose ``eosink.egg-info`` would otherwise be the
    distribution ``importlib.metadata`` finds first (and the release would report the checkout's version)."""
    site = release_site(commit)
    return {"extra_env": {"PYTHONPATH": str(site)}, "cwd": site.parent}


def version_of(url: str) -> str:
    """The version a worker's REST API reports (``GET /``, as Kafka Connect's)."""
    with urllib.request.urlopen(f"{url}/", timeout=5) as r:
        return str(json.loads(r.read())["version"])


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:5])} ... failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
