"""How a worker process takes the signals an orchestrator or a shell sends it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.procs import WorkerProcess, wait_until


def test_a_burst_of_sigterms_stops_the_worker_instead_of_hanging_it(stack, unique: str, tmp_path: Path) -> None:
    # A shell that kills the worker and then kills it again on EXIT (a trap), or an orchestrator that
    # repeats its SIGTERM, lands a second signal while the first one's handler runs. Setting the stop
    # Event right in the handler took the Event's lock: the second handler, run on the same thread
    # between two bytecodes of the first, waited for that lock forever, and the worker hung, still
    # holding its REST port, until SIGKILL.
    workers = [WorkerProcess(stack, unique, f"w{i}", tmp_path) for i in range(3)]
    try:
        for w in workers:
            wait_until(lambda w=w: "worker_started" in w.log_text(), 60, f"{w.worker_id} started")
        for w in workers:
            for _ in range(300):
                os.kill(w.proc.pid, signal.SIGTERM)
        for w in workers:
            try:
                rc = w.wait(30)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{w.worker_id} still runs 30 s after a burst of SIGTERMs "
                                     f"(log: {w.log_path})") from None
            assert rc == 0, f"{w.worker_id} exited {rc} (log: {w.log_path})"
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.wait(10)
