"""Helpers for the control-plane tests: workers with a REST port, a raw HTTP call, a JSON outbox."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.procs import WorkerProcess, free_port, wait_until


def call(url: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON body or None, headers); never raises on an HTTP error status."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json",
                                                                                 **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            status, hdrs = r.status, dict(r.headers)
    except urllib.error.HTTPError as exc:
        text, status, hdrs = exc.read(), exc.code, dict(exc.headers)
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = text.decode(errors="replace")
    return status, parsed, hdrs


def start_worker(stack, cluster: str, worker_id: str, log_dir: Path, **kw: Any) -> WorkerProcess:
    """A worker with its REST API on a free port, once ``/ready`` answers 200."""
    w = WorkerProcess(stack, cluster, worker_id, log_dir, rest_port=free_port(), **kw)

    def ready() -> bool:
        if w.proc.poll() is not None:
            raise AssertionError(f"worker {worker_id} exited with {w.proc.returncode}:\n{w.log_text()[-3000:]}")
        try:
            return call(w.url, "GET", "/ready", timeout=2)[0] == 200
        except OSError:
            return False

    wait_until(ready, 60, f"worker {worker_id} to be ready")
    return w


def produce(bootstrap: str, topic: str, values: list[tuple[int, bytes]]) -> None:
    """``(partition, value)`` pairs in one committed Kafka transaction."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"restkit-{topic}-{time.monotonic_ns()}"})
    p.init_transactions(30)
    p.begin_transaction()
    for partition, value in values:
        p.produce(topic, value=value, partition=partition)
    p.commit_transaction(30)


def pg_ids(pg, table: str, column: str = "id") -> list[str]:
    if not pg.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:
        return []
    return [r[0] for r in pg.execute(f'SELECT "{column}" FROM "{table}"')]


def wait_tasks_on(url: str, connector: str, workers: set[str], timeout: float = 60) -> None:
    """Until the connector's tasks run on exactly ``workers`` (``GET /connectors/<name>/status`` at ``url``): a worker
    that joined a moment after the others gets its share at the next assignment, not at once."""
    def holders() -> set[str]:
        status = call(url, "GET", f"/connectors/{connector}/status")[1] or {}
        return {t.get("worker_id", "") for t in status.get("tasks", []) if t.get("state") == "RUNNING"}

    wait_until(lambda: holders() == workers, timeout, f"tasks of {connector} running on {sorted(workers)}")
