"""Keep freed large buffers in the process heap instead of handing them back to the kernel.

A cycle of a batching sink builds megabytes of body (a 3 MB object per partition is usual) and
drops them once the cycle commits. glibc serves such blocks with ``mmap`` or trims them off the
top of the heap when freed, so every cycle asks the kernel for fresh pages again and pays a page
fault per 4 KiB on first touch - on the VMs measured here that cost three times the encoding
itself (12 MB per cycle: ~3,200 faults, 30 ms of wall time for 11 ms of work). Raising the mmap
and trim thresholds makes the next cycle reuse the same pages. The process keeps its high-water
mark instead (bounded by ``batch.max.bytes`` and the cycle's buffers), which a long-running
worker reaches on its first cycles anyway.

Process-wide and idempotent; a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap (glibc caps the mmap threshold at 32 MiB on 64-bit).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free memory at the top of the heap kept for reuse before any is returned to the kernel.
TRIM_THRESHOLD = 256 * 1024 * 1024

_done = False
_lock = threading.Lock()


def keep_freed_memory() -> bool:
    """Apply the thresholds once per process; True when the C library took them."""
    global _done
    with _lock:
        if _done:
            return True
        name = ctypes.util.find_library("c")
        if name is None:
            return False
        try:
            mallopt = ctypes.CDLL(name).mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            return False
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        return _done
