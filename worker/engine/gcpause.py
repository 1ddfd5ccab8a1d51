"""The cyclic garbage collector paused while a batch is built and while its cycle runs.

Process-wide and counted: several task threads (one per connector) may hold a pause at once, and
the collector runs again when the last lets go.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0
_disabled_here = False
_paused_since = 0.0
#: Several task threads whose pauses overlap could keep the collector off indefinitely, and the
#: cycles other threads make (REST requests, ZooKeeper callbacks, sink clients) would pile up: once
#: it has been off this long, the next pause runs one collection first.
GC_MAX_PAUSE_S = 10.0


def pause() -> None:
    """Pause the cyclic garbage collector while a batch is built (paired with :func:`resume`).

    A batch is up to ``max_records`` freshly allocated containers (a ``SinkRecord`` and the decoded
    value's dicts per record) that all survive the batch: with the collector on, its generation
    thresholds (700 allocations) keep re-scanning that growing young heap, and the full collections
    it provokes rescan everything alive - measured at ~40% of a poll of 200-byte JSON records.
    Building a batch creates no reference cycle, so pausing leaks nothing: reference counting still
    frees everything; the collector runs again as soon as the last concurrent poll (one per task
    thread) is done and no task is working through a backlog (:class:`Hold`), and collects whatever
    cycles other threads made meanwhile.
    """
    global _holders, _disabled_here, _paused_since
    with _lock:
        now = time.monotonic()
        if _holders == 0:
            _disabled_here = gc.isenabled()
            if _disabled_here:
                gc.disable()
                _paused_since = now
        elif _disabled_here and now - _paused_since > GC_MAX_PAUSE_S:
            gc.collect()  # off for too long under overlapping pauses: collect once, stay paused
            _paused_since = time.monotonic()
        _holders += 1


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector paused for a block (nested and concurrent uses count; see :func:`pause`).

    The task holds it for a whole cycle: the batch - hundreds of thousands of containers - is
    created by the poll and freed by reference counting when the cycle ends, so a collection in
    between (the first allocation after the poll would start one) would only walk it for nothing.
    Whatever cycles the sinks' clients create meanwhile are collected right after the cycle."""
    pause()
    try:
        yield
    finally:
        resume()


class Hold:
    """A pause held across a task's cycles while they deliver back to back (``set(True)``), let go
    when the task idles, backs off or stops (``set(False)``).

    A cycle's batch outlives it: the source keeps the last batch's records and frees them a slice at a
    time while it reads the next (see ``KafkaSource._poll_batch``). Made while the collector was
    paused, they are all in its youngest generation when the cycle ends, so resuming it there made
    the first allocation after the cycle start a collection that walked the whole batch - 80-120 ms
    for 200,000 records, between every two cycles of a backlog, on the task thread. Held, the pause
    spans the backlog; :data:`GC_MAX_PAUSE_S` still bounds how long cyclic garbage from other
    threads waits, and the collector comes back as soon as the task has nothing to read."""

    def __init__(self) -> None:
        self.held = False

    def set(self, hold: bool) -> None:
        if hold and not self.held:
            pause()
        elif self.held and not hold:
            resume()
        self.held = hold


def resume() -> None:
    global _holders, _disabled_here
    with _lock:
        _holders -= 1
        if _holders == 0 and _disabled_here:
            _disabled_here = False
            gc.enable()
