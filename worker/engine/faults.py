"""Fault-injection points for the process-level chaos tests.

Enabled only by the environment: ``EOSINK_FAULT=<point>[:<nth>[:<action>]]`` acts the ``nth``
time (default 1st) execution reaches ``point``: ``kill`` (default) sends this process SIGKILL,
``stop`` sends it SIGSTOP (a paused "zombie" that a test later wakes with SIGCONT). When the variable is unset
``hit`` is a constant no-op, so production pays one attribute lookup per step.

Points, in cycle order: ``begin``, ``flush``, ``pre_commit`` (first sink prepared), ``after_prepare`` (before the
decision), ``after_decide`` (decided, nothing committed), ``mid_commit`` (first sink
committed), ``after_commit`` (all sinks committed, consumer offsets not yet), ``recover``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

POINTS = ("begin", "flush", "pre_commit", "after_prepare", "after_decide", "mid_commit", "after_commit", "recover")


class _Faults:
    def __init__(self, spec: str | None) -> None:
        self.point: str | None = None
        self.nth = 1
        self.seen = 0
        self.signal = signal.SIGKILL
        if spec:
            point, nth, action = (spec.split(":") + ["", ""])[:3]
            if point not in POINTS:
                raise ValueError(f"EOSINK_FAULT: unknown point {point!r}; one of {', '.join(POINTS)}")
            if action not in ("", "kill", "stop"):
                raise ValueError(f"EOSINK_FAULT: unknown action {action!r}; kill or stop")
            self.point = point
            self.nth = int(nth or 1)
            self.signal = signal.SIGSTOP if action == "stop" else signal.SIGKILL

    def hit(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen == self.nth:
            sys.stderr.write(f"EOSINK_FAULT: {self.signal.name} to pid {os.getpid()} at {point} #{self.seen}\n")
            sys.stderr.flush()
            # To this thread, not the process: a process-directed SIGSTOP goes to whichever thread the
            # kernel picks (the main one, asleep), and the whole process stops only once that thread
            # is scheduled - meanwhile this one ran on past the point (on a loaded machine it decided
            # and committed the txn before the "zombie" stopped). A thread-directed one stops the
            # process before this call returns.
            signal.pthread_kill(threading.get_ident(), self.signal)


FAULTS = _Faults(os.environ.get("EOSINK_FAULT"))
