"""Durability helpers shared by the connectors that write local files.

A full volume (``ENOSPC``) or an exhausted quota (``EDQUOT``) is transient for a sink: nothing it
holds is wrong, the cycle is aborted and retried, and delivery resumes once space returns. Writes
here therefore never leave a half-written file behind (the space it took is given back at once),
and :func:`describe_os_error` names the file and the volume, so the retried error an operator
reads in ``/status`` says which disk to free.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

#: errno values that mean "no room on this volume for now": ENOSPC (full) and EDQUOT (quota).
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so a file created or renamed in it survives a crash (POSIX)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def describe_os_error(exc: OSError, volume: str | os.PathLike[str]) -> str:
    """What failed, on which file and volume; for a full disk, also what the operator can do."""
    where = exc.filename if exc.filename is not None else os.fspath(volume)
    if exc.errno in DISK_FULL:
        kind = "disk full" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        return (f"{kind}: no space left on the volume of {os.fspath(volume)} writing {where} "
                f"([Errno {exc.errno}] {exc.strerror}); free space or grow the volume: delivery resumes by itself")
    return f"{where}: [Errno {exc.errno}] {exc.strerror}" if exc.errno is not None else f"{where}: {exc}"


def write_durably(path: Path, chunks: Iterable[bytes], *, fsync: bool = True) -> None:
    """Write ``chunks`` to a temporary file, fsync it (with ``fsync``) and rename it into place.

    Each chunk is handed to the kernel's writeback as soon as it is written (``POSIX_FADV_DONTNEED``
    starts writeback of dirty pages): for a batch encoded slice by slice (a generator), the disk
    works while the next slice is encoded and the final fsync waits only for the tail.

    On any failure the temporary file is removed (a full disk gets its space back, and nothing
    half-written stays) and the :class:`OSError` names ``path``, also when the kernel named no file
    (a ``write`` or ``fsync`` that fails with ENOSPC carries none)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            fd, written = f.fileno(), 0
            for data in chunks:
                f.write(data)
                if fsync:
                    f.flush()
                    os.posix_fadvise(fd, written, len(data), os.POSIX_FADV_DONTNEED)
                written += len(data)
            f.flush()
            if fsync:
                os.fsync(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the error being raised says more than this one
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc  # the errno's own subclass
