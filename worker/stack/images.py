"""``eosink images build``: the worker and Spark job images, built on this machine.

Why not a plain ``docker build``: many machines that run eosink have no Docker engine and cannot
reach Docker Hub. Here the images are built with a Docker engine when one answers, else with
podman (``--runtime runc``: crun cannot run under hybrid cgroups; explicit ulimits: root may
lack CAP_SYS_RESOURCE), from the same Dockerfiles:

* the base is made from Debian's own packages (``mmdebstrap`` bookworm, imported as
  ``eosink-base:bookworm``) instead of ``python:3.11-slim-bookworm`` from Docker Hub; the
  Dockerfiles keep the public image as their default ``BASE_IMAGE``;
* Python dependencies come from a wheelhouse built on the host with the pinned constraints
  (``docker/wheelhouse/<image>/``), which the Dockerfiles install with ``--no-index``; without
  one they install from PyPI, so the same Dockerfile builds air-gapped and online.

The rootfs tar, the base image and each wheelhouse are reused while their inputs are unchanged.
On a machine without podman, docker or mmdebstrap, root gets them from apt-get; anyone else gets
an error naming the packages to install.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from eosink.connectors.api.errors import ConfigError, FatalError

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
WHEELHOUSE = DOCKER / "wheelhouse"
SUITE = "bookworm"
BASE_IMAGE = f"eosink-base:{SUITE}"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd", "procps")
CONTAINER_PACKAGES = ("podman", "runc", "mmdebstrap")
#: podman as root without CAP_SYS_RESOURCE cannot apply its default ulimits: pass them explicitly.
ULIMITS = ("--ulimit", "nofile=20000:20000", "--ulimit", "nproc=20000:20000")


@dataclass(frozen=True)
class Image:
    """One image of the product: its Dockerfile and the pyproject extra its wheelhouse holds."""

    key: str
    name: str
    dockerfile: str
    extra: str

    def tag(self, version: str) -> str:
        return f"{self.name}:{version}"


IMAGES: dict[str, Image] = {
    "worker": Image("worker", "eosink-worker", "docker/worker.Dockerfile", "worker"),
    "spark": Image("spark", "eosink-spark", "docker/spark-job.Dockerfile", "spark"),
}


@dataclass(frozen=True)
class Engine:
    """The container engine's command line: ``argv`` prefixes every call, the rest go to build/run."""

    name: str
    argv: tuple[str, ...]
    build_flags: tuple[str, ...]
    run_flags: tuple[str, ...]

    def cmd(self, *args: str) -> list[str]:
        return [*self.argv, *args]


class Built(TypedDict):
    """What :func:`build` reports per image (the size and build-time table of docs/operations/containers.md comes from these)."""

    tag: str
    size_bytes: int
    build_seconds: float


def _is_root() -> bool:
    return os.geteuid() == 0


def _apt_install(packages: Sequence[str], report: Callable[[str], None]) -> bool:
    """Install Debian packages when we may (root with apt-get); True when something was attempted."""
    if not (_is_root() and shutil.which("apt-get")):
        return False
    report(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, check=False)
    return True


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        r = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and bool(r.stdout.strip())


def podman() -> Engine:
    runtime = ("--runtime", "runc") if shutil.which("runc") else ()
    return Engine("podman", ("podman", *runtime), ("--format", "docker", "--network", "host", *ULIMITS), ULIMITS)


def find_engine(install: bool = True, report: Callable[[str], None] = lambda _: None) -> Engine:
    """Docker when its engine answers, else podman (installed with apt-get when root and missing).

    ``EOSINK_CONTAINER_ENGINE=podman|docker`` chooses explicitly.
    """
    wanted = os.environ.get("EOSINK_CONTAINER_ENGINE", "")
    if wanted not in ("", "docker", "podman"):
        raise ConfigError(f"EOSINK_CONTAINER_ENGINE={wanted!r}: expected docker or podman", key="EOSINK_CONTAINER_ENGINE")
    if wanted in ("", "docker") and _docker_answers():
        return Engine("docker", ("docker",), ("--network", "host"), ())
    if wanted == "docker":
        raise FatalError("EOSINK_CONTAINER_ENGINE=docker but no Docker engine answers `docker info`; start dockerd "
                         "or unset it to use podman", component="images")
    if not shutil.which("podman") and install:
        _apt_install(CONTAINER_PACKAGES, report)
    if not shutil.which("podman"):
        raise FatalError("no container engine: neither podman nor a running Docker engine was found; install podman "
                         f"(`sudo apt-get install -y {' '.join(CONTAINER_PACKAGES)}`) or Docker", component="images")
    return podman()


def _digest(*paths: Path, extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """Rootfs tars: ``$EOSINK_IMAGES_CACHE``, else ``.eosink/images`` of the checkout (outside the build context)."""
    return Path(os.environ.get("EOSINK_IMAGES_CACHE") or REPO / ".eosink" / "images")


def ensure_base(engine: Engine, report: Callable[[str], None], install: bool = True) -> str:
    """``eosink-base:bookworm`` from Debian packages (mmdebstrap + import), reusing tar and image when present."""
    packages = ",".join(BASE_PACKAGES)
    key = _digest(extra=f"{SUITE}:{packages}")
    tag = f"{BASE_IMAGE}-{key[:8]}"
    if subprocess.run(engine.cmd("image", "exists" if engine.name == "podman" else "inspect", tag),
                      capture_output=True, check=False).returncode == 0:
        return tag
    tar = cache_dir() / f"rootfs-{SUITE}-{key}.tar"
    if not tar.exists():
        if not shutil.which("mmdebstrap") and install:
            _apt_install(["mmdebstrap"], report)
        if not shutil.which("mmdebstrap"):
            raise FatalError("mmdebstrap is needed to make the Debian base image: `sudo apt-get install -y mmdebstrap` "
                             "(or build from the public base: eosink images build --public-base)", component="images")
        tar.parent.mkdir(parents=True, exist_ok=True)
        report(f"making a Debian {SUITE} rootfs with mmdebstrap ({packages}) -> {tar}")
        partial = tar.with_suffix(".tar.partial")
        _run(["nice", "mmdebstrap", "--variant=minbase", "--format=tar", f"--include={packages}", SUITE, str(partial)], "mmdebstrap")
        partial.replace(tar)
    report(f"importing {tar.name} as {tag}")
    _run(engine.cmd("import", "--change", 'CMD ["/bin/bash"]', str(tar), tag), f"{engine.name} import")
    return tag


def ensure_wheelhouse(image: Image, report: Callable[[str], None]) -> Path:
    """Wheels for ``.[extra]`` pinned by constraints.txt, rebuilt only when constraints or pyproject change."""
    if sys.version_info[:2] != (3, 11):
        raise FatalError(f"the wheelhouse must be built with Python 3.11 (the images' Python), not {sys.version.split()[0]}: "
                         "run eosink images build from a 3.11 venv", component="images")
    out = WHEELHOUSE / image.key
    stamp = out / ".stamp"
    key = _digest(REPO / "constraints.txt", REPO / "pyproject.toml", extra=image.extra)
    if stamp.exists() and stamp.read_text().strip() == key and any(out.glob("*.whl")):
        return out
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    report(f"building the {image.key} wheelhouse (.[{image.extra}] pinned by constraints.txt) -> {out.relative_to(REPO)}")
    _run(["nice", sys.executable, "-m", "pip", "wheel", "-q", "-c", "constraints.txt", "-w", str(out),
          f".[{image.extra}]", "setuptools>=77", "wheel"], "pip wheel", cwd=REPO)
    for own in out.glob("eosink-*.whl"):  # the image builds eosink from its source, never from a stale wheel
        own.unlink()
    stamp.write_text(key + "\n")
    return out


def build(keys: Sequence[str], *, public_base: bool = False, offline: bool = True, install: bool = True,
          report: Callable[[str], None] = print) -> dict[str, Built]:
    """Build the named images; returns per image its tag, size in bytes and build seconds."""
    from eosink.worker.version import VERSION

    if not (DOCKER / "worker.Dockerfile").is_file():
        raise FatalError(f"no Dockerfiles under {DOCKER}: build the images from a source checkout of eosink", component="images")
    unknown = [k for k in keys if k not in IMAGES]
    if unknown:
        raise ConfigError(f"unknown image {', '.join(unknown)}; one of: {', '.join(IMAGES)}", key="image")
    engine = find_engine(install=install, report=report)
    base = None if public_base else ensure_base(engine, report, install=install)
    results: dict[str, Built] = {}
    for key in keys:
        image = IMAGES[key]
        out = WHEELHOUSE / image.key
        if offline:
            ensure_wheelhouse(image, report)
        else:
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("*.whl"):
                old.unlink()
            (out / ".stamp").unlink(missing_ok=True)
        tag = image.tag(VERSION)
        argv = engine.cmd("build", *engine.build_flags, "-f", image.dockerfile, "-t", tag)
        if base:
            argv += ["--build-arg", f"BASE_IMAGE={'localhost/' if engine.name == 'podman' else ''}{base}"]
        report(f"building {tag} with {engine.name} from {image.dockerfile}" + (f" on {base}" if base else ""))
        previous = _image_id(engine, tag)
        t0 = time.monotonic()
        _run(["nice", *argv, "."], f"{engine.name} build {tag}", cwd=REPO, quiet=False)
        seconds = time.monotonic() - t0
        if previous and previous != _image_id(engine, tag):
            # the tag moved: drop the image it named (and its now unused layers), or every rebuild keeps ~1 GB more;
            # refused, and left alone, while a container still uses it
            subprocess.run(engine.cmd("rmi", previous), capture_output=True, check=False)
        results[key] = {"tag": tag, "size_bytes": image_size(engine, tag), "build_seconds": round(seconds, 1)}
        report(f"built {tag}: {results[key]['size_bytes'] / 1e6:.0f} MB in {seconds:.1f} s")
    return results


def _image_id(engine: Engine, tag: str) -> str:
    r = subprocess.run(engine.cmd("image", "inspect", "--format", "{{.Id}}", tag), capture_output=True, text=True, check=False)
    return r.stdout.strip() if r.returncode == 0 else ""


def image_size(engine: Engine, tag: str) -> int:
    r = subprocess.run(engine.cmd("image", "inspect", "--format", "{{.Size}}", tag), capture_output=True, text=True, check=False)
    return int(r.stdout.strip() or 0)


def _run(argv: list[str], what: str, cwd: Path | None = None, quiet: bool = True) -> None:
    r = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=quiet, text=True, check=False)
    if r.returncode != 0:
        tail = "\n".join(((r.stderr or "") + (r.stdout or "")).strip().splitlines()[-15:]) if quiet else "(output above)"
        raise FatalError(f"{what} failed with exit code {r.returncode}:\n{tail}", component="images")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eosink images", description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the worker and Spark job images (podman when no Docker engine answers)")
    b.add_argument("images", nargs="*", default=list(IMAGES), help=f"which ({', '.join(IMAGES)}; default all)")
    b.add_argument("--public-base", action="store_true", help="build on the Dockerfiles' public base (python:3.11-slim-bookworm)")
    b.add_argument("--online", action="store_true", help="no wheelhouse: pip inside the build installs from PyPI")
    b.add_argument("--no-install", action="store_true", help="never apt-get install podman/runc/mmdebstrap")
    args = ap.parse_args(argv)
    results = build(args.images, public_base=args.public_base, offline=not args.online, install=not args.no_install)
    for r in results.values():
        print(f"{r['tag']}\t{r['size_bytes'] / 1e6:.0f} MB\t{r['build_seconds']} s")
    return 0
