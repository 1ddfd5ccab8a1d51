"""A small real volume to fill: a tmpfs (or ext4 on a loop device) mounted for one test, and a
filler that keeps it full.

Mounting needs root (CAP_SYS_ADMIN): elsewhere the tests that use it skip, saying why. The mount
is always undone, lazily when a process still holds it (a worker being stopped).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(argv: list[str], what: str) -> None:
    """Run a mount command; skip the test, saying why, when it cannot be (not root, no such tool)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
        why = done.stderr.strip() if done.returncode != 0 else ""
    except FileNotFoundError as e:
        why = f"no {argv[0]} command ({e})"
    if why:
        pytest.skip(f"cannot mount {what} (needs root): {why}")


class Volume:
    """A small filesystem mounted at ``path`` until :meth:`unmount`: a tmpfs, or ext4 on a loop device."""

    def __init__(self, path: Path, size: str, kind: str = "tmpfs") -> None:
        self.path, self.kind = path, kind
        self.image: Path | None = None
        path.mkdir(parents=True, exist_ok=True)
        if kind == "tmpfs":
            _mount(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], f"a {size} tmpfs at {path}")
            return
        self.image = path.with_name(path.name + ".img")
        _mount(["truncate", "-s", size.upper(), str(self.image)], f"an image for {path}")
        _mount(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)], f"ext4 on {self.image}")  # -m 0: root has no reserve
        _mount(["mount", "-o", "loop", str(self.image), str(path)], f"a {size} ext4 loop device at {path}")

    def grow(self, size: str) -> None:
        """``mount -o remount,size=...`` (tmpfs): the operator grows the volume; its files stay."""
        assert self.kind == "tmpfs", "only a tmpfs grows in place here"
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def unmount(self) -> None:
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], check=True)
        if self.image is not None:
            self.image.unlink(missing_ok=True)


@contextlib.contextmanager
def volume(path: Path, size: str, kind: str = "tmpfs") -> Iterator[Volume]:
    mounted = Volume(path, size, kind)
    try:
        yield mounted
    finally:
        mounted.unmount()


def tmpfs(path: Path, size: str) -> contextlib.AbstractContextManager[Volume]:
    return volume(path, size, "tmpfs")


class Filler(threading.Thread):
    """Keeps a volume full while it runs: appends to ``<dir>/filler`` until ENOSPC, then takes
    every page anything else gives back (a sink removing a failed file), as a runaway log would.
    :meth:`stop` stops filling; :meth:`release` deletes the filler."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.path = directory / "filler"
        self.stopping = threading.Event()
        self.full = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        chunk = b"\0" * 4096
        try:
            with open(self.path, "ab", buffering=0) as f:
                while not self.stopping.is_set():
                    try:
                        f.write(chunk)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        self.full.set()
                        small = b"\0" * 512  # a partial page is still room for someone else
                        with contextlib.suppress(OSError):
                            while True:
                                f.write(small)
                        self.stopping.wait(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.failure = e
            self.full.set()

    def fill(self) -> Filler:
        """Start and return once the volume is full."""
        self.start()
        assert self.full.wait(30), f"{self.path} did not fill up in 30 s"
        assert self.failure is None, f"filling {self.path} failed: {self.failure!r}"
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        assert self.failure is None, f"filling {self.path} failed: {self.failure!r}"

    def release(self) -> None:
        self.stop()
        self.path.unlink(missing_ok=True)


def files_open_for_writing(pid: int) -> set[str]:
    """The regular files process ``pid`` holds open for writing now (from /proc/<pid>/fd and fdinfo)."""
    out: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        except (OSError, StopIteration):
            continue  # closed meanwhile
        if target.startswith("/") and flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR) and os.path.isfile(target):
            out.add(target)
    return out
