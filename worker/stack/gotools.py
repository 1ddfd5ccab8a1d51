"""Go programs of the local stack (Prometheus, MinIO) built once from their Go modules into a cache.

Servers written in Go publish no jars and, for a pinned version, no package every distribution
carries; ``go install module/cmd/name@version`` builds the exact version from source with only a
Go toolchain. A build takes minutes and hundreds of MB of module downloads, so it happens once per
version, into ``$XDG_CACHE_HOME/eosink/<tool>/<version>/`` (``~/.cache`` by default), where
``<tool>`` is the module's last path element (``prometheus``, ``minio``). A file lock lets two
processes that need the same binaries take turns (the second finds them built), and the build
prints an elapsed-time line every ~10 s on stderr so that a first run is not mistaken for a hang.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from eosink.worker.stack import proc
from eosink.worker.stack.errors import ComponentError

GO_BUILD_TIMEOUT_S = 1800
#: Where progress lines go: a stream (stderr) or the stack's reporter (:class:`ReportLines`).
Out = TextIO | io.TextIOBase
PROGRESS_EVERY_S = 10.0


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eosink"


def tool_name(module: str) -> str:
    """The cache folder of a module: its last path element (``github.com/prometheus/prometheus`` -> ``prometheus``)."""
    return module.rstrip("/").rsplit("/", 1)[-1]


def package_of(module: str, name: str, root: str | None = None) -> str:
    """The package that builds binary ``name``: the module itself for ``root``, the binary whose main package is
    the module's root (MinIO's ``minio``), else ``cmd/<name>``. Being named like the module says nothing:
    Prometheus' ``prometheus`` is ``cmd/prometheus``, and its root is no package at all."""
    return module if name == root else f"{module}/cmd/{name}"


def binary_dir(module: str, version: str, tool: str | None = None) -> Path:
    return cache_root() / (tool or tool_name(module)) / version


def go_binary(module: str, version: str, names: Sequence[str], *, root: str | None = None, component: str | None = None,
              progress: Out | None = None, tool: str | None = None) -> dict[str, Path]:
    """Paths of the binaries ``names`` of ``module@version``, built with ``go install`` when missing.

    ``root`` names the binary built from the module's root package (see :func:`package_of`);
    ``component`` names the caller in errors (default: the tool); ``progress`` receives the build's
    progress lines (default: stderr); ``tool`` names the cache folder where the module's last path
    element does not (``helm.sh/helm/v3`` would be ``v3``). Raises :class:`ComponentError` naming Go
    when ``go`` is not on PATH, and quoting the build's last lines when it fails.
    """
    if not names:
        raise ValueError("go_binary needs at least one binary name")
    folder = tool or tool_name(module)
    who = component or folder
    target = binary_dir(module, version, tool)
    paths = {n: target / n for n in names}
    if all(os.access(p, os.X_OK) for p in paths.values()):
        return paths
    go = shutil.which("go")
    if go is None:
        raise ComponentError(
            who,
            f"the Go toolchain (`go`) was not found on PATH; it is needed once to build {', '.join(names)} "
            f"{version} from {module} into {target} (install Go 1.24+ (Debian: apt-get install golang-go, or put go on PATH), "
            "or put already built binaries there)",
            None,
        )
    with proc.file_lock(cache_root() / folder / ".build.lock"):
        if all(os.access(p, os.X_OK) for p in paths.values()):  # another process built them while we waited
            return paths
        target.mkdir(parents=True, exist_ok=True)
        argv = [go, "install", *(f"{package_of(module, n, root)}@{version}" for n in names)]
        env = {**os.environ, "GOBIN": str(target), "CGO_ENABLED": os.environ.get("CGO_ENABLED", "0")}
        what = f"building {', '.join(names)} {version} with Go (first run only)"
        done = run_with_progress(argv, env, what, who, progress or sys.stderr)
        missing = [n for n, p in paths.items() if not os.access(p, os.X_OK)]
        if done.returncode != 0 or missing:
            tail = "\n".join(proc.strip_ansi(done.stdout + done.stderr).splitlines()[-20:])
            raise ComponentError(who, f"`{' '.join(argv)}` failed (exit {done.returncode}; missing: {missing or 'none'})",
                                 None, tail)
    return paths


def run_with_progress(argv: list[str], env: dict[str, str] | None, what: str, component: str, out: Out,
                      timeout_s: float = GO_BUILD_TIMEOUT_S, every_s: float | None = None
                      ) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to completion, printing ``what...`` first and an elapsed-time line every ``every_s``
    (default :data:`PROGRESS_EVERY_S`)."""
    every = PROGRESS_EVERY_S if every_s is None else every_s
    print(f"{component}: {what}...", file=out, flush=True)
    started = time.monotonic()
    finished = threading.Event()

    def tick() -> None:
        while not finished.wait(every):
            print(f"{component}: still {what.split(' (')[0]}, {time.monotonic() - started:.0f} s so far", file=out, flush=True)

    ticker = threading.Thread(target=tick, name=f"progress-{component}", daemon=True)
    ticker.start()
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ComponentError(component, f"`{' '.join(argv)}` did not finish within {timeout_s:.0f} s", None) from None
    finally:
        finished.set()
        ticker.join()
        print(f"{component}: done after {time.monotonic() - started:.0f} s", file=out, flush=True)


class ReportLines(io.TextIOBase):
    """A text stream that hands each complete line to ``report`` (the stack's progress printer)."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self.report = report
        self._buf = ""

    def write(self, text: str) -> int:
        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            if line:
                self.report(line)
        return len(text)
