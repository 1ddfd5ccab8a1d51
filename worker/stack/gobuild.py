"""Servers built from a Go module at a pinned version, once, into the user cache.

``go install <module>@<version>`` with ``GOBIN`` set to ``<cache>/eosink/<name>/<version>``:
the pinned version makes the build reproducible, and the directory per version means a binary
that exists is never built again (a new pin builds afresh next to the old one). A cold build of
MinIO takes minutes (module download and compile), so it prints progress lines while it runs,
and a file lock makes two ``stack up`` calls take turns instead of building twice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from eosink.worker.stack import proc
from eosink.worker.stack.errors import ComponentError

#: A cold MinIO build measured 3 min 45 s; this bounds a hung download, not a slow machine.
BUILD_TIMEOUT_S = 1800.0
#: Seconds between "still building" lines.
PROGRESS_EVERY_S = 30.0
GO_MISSING = "install Go 1.24+ (Debian: apt-get install golang-go, or put go on PATH)"

# Threads of one process take turns too (flock is per open file, not per thread).
_build_turn = threading.Lock()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eosink"


def binary_path(name: str, version: str) -> Path:
    return cache_root() / name / version / name


def ensure_binary(name: str, module: str, version: str, component: str, *,
                  report: Callable[[str], None], log_path: Path | None = None) -> Path:
    """The path of ``name`` built from ``module@version``, building it first if it is missing."""
    target = binary_path(name, version)
    if os.access(target, os.X_OK):
        return target
    with _build_turn, proc.file_lock(cache_root() / name / ".build.lock"):
        if os.access(target, os.X_OK):  # another process built it while we waited
            return target
        go = shutil.which("go")
        if go is None:
            raise ComponentError(component, f"{name} is not built yet ({target} is missing) and `go` was not found "
                                 f"on PATH to build it from {module}@{version}: {GO_MISSING}", None)
        _build(go, name, module, version, target, component, report, log_path)
    return target


def _build(go: str, name: str, module: str, version: str, target: Path, component: str,
           report: Callable[[str], None], log_path: Path | None) -> None:
    # Built into a scratch GOBIN and renamed into place: a build killed halfway never leaves a
    # partial binary where the next run would take it for a finished one.
    scratch = target.parent.with_name(target.parent.name + ".building")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log = log_path or scratch / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    report(f"{component}: building {name} {version} from its Go module (first run only, ~4 min)...")
    env = {**os.environ, "GOBIN": str(scratch), "CGO_ENABLED": os.environ.get("CGO_ENABLED", "0")}
    started = time.monotonic()
    with open(log, "ab") as out:
        child = subprocess.Popen([go, "install", f"{module}@{version}"], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, env=env, cwd=scratch)
        try:
            while True:
                try:
                    code = child.wait(PROGRESS_EVERY_S)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > BUILD_TIMEOUT_S:
                        child.kill()
                        child.wait()
                        raise ComponentError(component, f"building {module}@{version} took over "
                                             f"{BUILD_TIMEOUT_S:.0f}s; gave up", log, proc.log_tail(log)) from None
                    report(f"{component}: still building {name} ({elapsed:.0f}s elapsed, log: {log})")
        except BaseException:
            if child.poll() is None:
                child.kill()
                child.wait()
            raise
    built = scratch / name
    if code != 0 or not os.access(built, os.X_OK):
        raise ComponentError(component, f"`go install {module}@{version}` failed with code {code}", log,
                             proc.log_tail(log))
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(built, target)
    shutil.rmtree(scratch, ignore_errors=True)
    report(f"{component}: built {name} {version} in {time.monotonic() - started:.0f}s ({target})")
