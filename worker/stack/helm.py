"""Helm, built from its Go module, and the chart under ``deploy/helm/eosink`` rendered with it.

Helm publishes no package that every distribution carries at a pinned version, and its release
binaries come from a download site this project cannot rely on; ``go install
helm.sh/helm/v3/cmd/helm@<version>`` builds the exact version from the Go module proxy (~75 s, then
cached under ``~/.cache/eosink/helm/<version>/`` like Prometheus and MinIO, with progress lines).
``helm lint`` and ``helm template`` need no cluster, so the chart is checked - and its manifests
produced for ``podman kube play`` - on any machine with a Go toolchain.

Helm's own state (repositories, plugins, registry logins) goes to a folder of the cache, never to
the user's ``~/.config/helm``: rendering a local chart must not depend on, or change, what an
operator configured.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from eosink.worker.stack.errors import ComponentError
from eosink.worker.stack.gotools import Out, cache_root, go_binary

MODULE = "helm.sh/helm/v3"
VERSION = "v3.22.0"
COMPONENT = "helm"
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "eosink"
#: The Kubernetes version ``helm template`` renders for (``.Capabilities``), the one the schemas check.
KUBE_VERSION = "1.34.0"


class HelmError(ComponentError):
    """``helm`` exited non-zero; ``message`` is its error line (what a user of ``helm install`` would read)."""


def binary(progress: Out | None = None) -> Path:
    """The ``helm`` binary of :data:`VERSION`, built once with ``go install``."""
    return go_binary(MODULE, VERSION, ["helm"], component=COMPONENT, progress=progress, tool="helm")["helm"]


def _env() -> dict[str, str]:
    home = cache_root() / "helm" / "home"
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}


def run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``helm ARGS``, its output captured; the caller decides what a failure means."""
    return subprocess.run([str(binary()), *args], env=_env(), capture_output=True, text=True, timeout=timeout_s, check=False)


def _values_file(values: dict[str, Any], folder: str) -> Path:
    path = Path(folder) / "values.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def _error(r: subprocess.CompletedProcess[str], what: str) -> HelmError:
    lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip() and not ln.startswith("Use --debug")]
    return HelmError(COMPONENT, f"{what} failed (exit {r.returncode}): {' '.join(lines)[-2000:]}", None)


def lint(values: dict[str, Any], chart: Path = CHART) -> str:
    """``helm lint --strict`` with ``values``; returns its report, raises :class:`HelmError` on a finding."""
    with tempfile.TemporaryDirectory(prefix="eosink-helm-") as d:
        r = run("lint", "--strict", str(chart), "-f", str(_values_file(values, d)), "--kube-version", KUBE_VERSION)
    if r.returncode != 0:
        raise _error(r, "helm lint")
    return r.stdout


def template(values: dict[str, Any], release: str = "eosink", namespace: str = "eosink", chart: Path = CHART,
             hooks: bool = True) -> list[dict[str, Any]]:
    """The manifests ``helm install`` would create (with its hooks unless ``hooks=False``), parsed."""
    with tempfile.TemporaryDirectory(prefix="eosink-helm-") as d:
        argv = ["template", release, str(chart), "--namespace", namespace, "-f", str(_values_file(values, d)),
                "--kube-version", KUBE_VERSION]
        r = run(*argv, *([] if hooks else ["--no-hooks"]))
    if r.returncode != 0:
        raise _error(r, "helm template")
    return [doc for doc in yaml.safe_load_all(r.stdout) if doc]


def main(argv: list[str] | None = None) -> int:
    """``python -m eosink.worker.stack.helm ARGS``: the pinned helm (built on first use) with ARGS (``make helm-template``)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    return subprocess.run([str(binary()), *args], env=_env(), check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
