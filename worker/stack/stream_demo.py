"""``eosink demo --stream`` (``make stream-demo``): the streaming balance example end to end, counted exactly once.

A source topic receives a deterministic set of account transactions (and one transaction that is
aborted); ``eosink spark run balance_alerts --stream`` keeps a running balance per user (update mode,
20 records a micro-batch, ``availableNow``) and publishes every balance change to a balances outbox and
every threshold crossing to an alerts outbox, in the same Kafka transaction; one worker delivers the
balances into PostgreSQL and the alerts to the HTTP reference server (started here). The streaming
driver is killed once mid-way (SIGKILL to its process group: the Python driver and its JVM) as soon
as a micro-batch has started, and the same command is run again: it resumes from its checkpoint.

Then each sink is read back by itself: every expected balance change is in PostgreSQL once, every
crossing is at the HTTP server once, nothing of the aborted transaction is anywhere, and no prepared
transaction of the demo's connector is left in PostgreSQL (``pg_prepared_xacts``). Every run uses
names of its own (topics, table, checkpoint, connectors), so nothing needs a reset; the table and the
HTTP server's data stay for a look afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eosink.connectors.api.errors import EosinkError
from eosink.worker.stack.demo import _row, _step, _wait_ready
from eosink.worker.stack.proc import free_port

THRESHOLD = 1000.0
PER_BATCH = 20  # records a micro-batch (maxOffsetsPerTrigger): the batches, and so the balance changes, are known
TRANSACTIONS = 60
ABORTED_USER = "u-aborted"  # the aborted transaction's user: no balance, no alert may ever name it


@dataclass(frozen=True)
class Names:
    """The run's own topics, table, job (also the worker's cluster and the connectors' prefix) and directory."""

    tag: str
    dir: Path
    source: str = ""
    balances: str = ""
    alerts: str = ""
    table: str = ""
    job: str = ""

    @classmethod
    def of(cls, tag: str, directory: Path) -> Names:
        return cls(tag, directory, f"demo-stream-txns-{tag}", f"demo-stream-balances-{tag}", f"demo-stream-alerts-{tag}",
                   f"demo_stream_balances_{tag}", f"demo-stream-{tag}")


def _produce(bootstrap: str, names: Names) -> None:
    """The committed transactions (idempotent producer), then one aborted transaction after them."""
    from confluent_kafka import Producer

    from eosink.spark_jobs.jobs.balance_stream import sample_transactions

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for r in sample_transactions(0, TRANSACTIONS):
        p.produce(names.source, json.dumps(r).encode(), r["user_id"].encode())
    if p.flush(30):
        raise EosinkError("the source transactions were not all acknowledged", component="demo")
    t = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"demo-stream-aborted-{names.tag}"})
    t.init_transactions(30)
    t.begin_transaction()
    for i in range(5):
        t.produce(names.source, json.dumps({"txn_id": f"aborted-{i}", "user_id": ABORTED_USER, "amount": 5000.0,
                                            "ts": "2026-01-01T01:00:00Z"}).encode(), ABORTED_USER.encode())
    t.flush(30)
    t.abort_transaction(30)


def _driver_argv(bootstrap: str, names: Names) -> list[str]:
    return [sys.executable, "-m", "eosink.worker.clients.cli", "spark", "run", "balance_alerts", "--stream",
            "--source", f"kafka:{names.source}", "--alerts-topic", names.alerts, "--balances-topic", names.balances,
            "--checkpoint", str(names.dir / "checkpoint"), "--available-now", "--threshold", str(THRESHOLD),
            "--max-offsets-per-trigger", str(PER_BATCH), "--job", names.job, "--bootstrap", bootstrap,
            "--master", "local[2]", "--no-create-topics"]


def _run_driver(bootstrap: str, names: Names, log_path: Path, kill_at_batch: int | None, timeout: float) -> int | None:
    """The streaming driver as a process group of its own; SIGKILLed once micro-batch ``kill_at_batch`` started
    (its offsets are in the checkpoint). Returns the exit code, or None when it was killed."""
    started = names.dir / "checkpoint" / "offsets" / str(kill_at_batch)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(_driver_argv(bootstrap, names), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise EosinkError(f"the streaming driver did not finish within {timeout:.0f} s", component="demo",
                                  log_file=str(log_path))
            if kill_at_batch is not None and started.exists():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
                return None
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return proc.returncode


def _post(url: str, doc: dict[str, Any]) -> None:
    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status not in (200, 201):
            raise EosinkError(f"POST {url}: {r.status}", component="demo")


def _connectors(names: Names, dsn: str, http_url: str) -> list[dict[str, Any]]:
    return [
        {"name": f"{names.job}-balances", "config": {"connector.class": "postgres", "topics": names.balances,
                                                     "connection.url": dsn, "table.name.format": names.table,
                                                     "auto.create": "true", "insert.mode": "insert"}},
        {"name": f"{names.job}-alerts", "config": {"connector.class": "http", "topics": names.alerts,
                                                   "http.url": http_url}},
    ]


def _seen(dsn: str, names: Names) -> tuple[Counter, Counter, int]:
    """(balance changes in PostgreSQL, alerts at the HTTP server, prepared transactions of the connector)."""
    import psycopg

    changes: Counter[tuple[str, float, int]] = Counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if _row(conn, "SELECT to_regclass(%s)", (names.table,))[0]:
            for user, balance, n in conn.execute(f'SELECT user_id, balance, transactions FROM "{names.table}"'):
                changes[(user, round(float(balance), 2), int(n))] += 1
        # gid = "eosink:" + the transaction id, which starts with the connector's name
        prepared = _row(conn, "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
                        (f"eosink:{names.job}-balances.",))[0]
    alerts: Counter[tuple[str, float]] = Counter()
    log = names.dir / "http" / "committed.jsonl"
    if log.exists():
        for line in log.read_text().splitlines():
            for v in json.loads(line)["records"] if line.strip() else []:
                v = json.loads(v) if isinstance(v, str) else v
                alerts[(v["user_id"], round(float(v["balance"]), 2))] += 1
    return changes, alerts, int(prepared)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eosink demo --stream", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-kill", action="store_true", help="run the driver once, without killing it mid-way")
    ap.add_argument("--kill-at-batch", type=int, default=2, help="SIGKILL the driver once this micro-batch started")
    ap.add_argument("--timeout", type=float, default=240, help="seconds for each driver run, and for the delivery")
    ap.add_argument("--dir", type=Path, help="where the checkpoint, the HTTP server's data and the logs go "
                                               "(default: $EOSINK_HOME/demo-stream/<run>)")
    args = ap.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    from eosink.spark_jobs.jobs.balance_stream import expected_outboxes, sample_transactions
    from eosink.worker.stack import load_endpoints
    from eosink.worker.stack.demo_access import for_stack

    t0 = time.monotonic()
    ep = load_endpoints()
    home = Path(os.environ.get("EOSINK_HOME", ".eosink")).resolve()
    if for_stack(ep, home).secure:
        raise EosinkError("eosink demo --stream runs on the open stack (eosink stack up); the secure stack has "
                          "`eosink demo`", component="demo")
    tag = uuid.uuid4().hex[:8]
    names = Names.of(tag, args.dir.resolve() / tag if args.dir else home / "demo-stream" / tag)
    (names.dir / "http").mkdir(parents=True, exist_ok=True)
    bootstrap = ep.kafka_bootstrap
    _step(f"topics {names.source} (1 partition), {names.balances} and {names.alerts} (2 each); files in {names.dir}")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(names.source, 1, 1), NewTopic(names.balances, 2, 1),
                                  NewTopic(names.alerts, 2, 1)]).values():
        f.result(30)
    _produce(bootstrap, names)
    _step(f"produced {TRANSACTIONS} transactions of 5 users, then 5 more in a transaction that was aborted")

    http_port, rest_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "EOSINK_LOG_FORMAT": "json"}
    try:
        with open(names.dir / "http.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "eosink.connectors.http.reference_server", "--port",
                                           str(http_port), "--data-dir", str(names.dir / "http")],
                                          stdout=log, stderr=subprocess.STDOUT))
        with open(names.dir / "worker.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--cluster",
                                           names.job, "--bootstrap-servers", bootstrap, "--zookeeper", ep.zookeeper_hosts,
                                           "--worker-id", "demo-worker", "--rest-host", "127.0.0.1", "--rest-port",
                                           str(rest_port)], stdout=log, stderr=subprocess.STDOUT, env=env))
        url = f"http://127.0.0.1:{rest_port}"
        _step(f"HTTP reference server on :{http_port}, a worker with its REST API on {url}")
        _wait_ready(url, procs[1], names.dir / "worker.log")
        for c in _connectors(names, ep.postgres_dsn, f"http://127.0.0.1:{http_port}"):
            _post(f"{url}/connectors", c)
        _step(f"connectors: {names.balances} -> PostgreSQL table {names.table}, {names.alerts} -> the HTTP server")

        driver_log = names.dir / "driver.log"
        command = " ".join(_driver_argv(bootstrap, names)[2:])
        kills = 0
        if not args.no_kill:
            _step(f"running the streaming query, to be killed once micro-batch {args.kill_at_batch} started: {command}")
            if _run_driver(bootstrap, names, driver_log, args.kill_at_batch, args.timeout) is None:
                kills = 1
                _step(f"SIGKILLed the driver (Python and JVM) in micro-batch {args.kill_at_batch}; running it again")
        rc = _run_driver(bootstrap, names, driver_log, None, args.timeout)
        if rc != 0:
            raise EosinkError(f"the streaming driver exited with code {rc}", component="demo", log_file=str(driver_log))
        _step("the query drained the topic; waiting for the worker to deliver")
        want_changes, want_alerts = expected_outboxes(sample_transactions(0, TRANSACTIONS), PER_BATCH, THRESHOLD)
        deadline = time.monotonic() + args.timeout
        changes, alerts, prepared = _seen(ep.postgres_dsn, names)
        while (sum(changes.values()) < sum(want_changes.values()) or sum(alerts.values()) < sum(want_alerts.values())) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
            changes, alerts, prepared = _seen(ep.postgres_dsn, names)
        time.sleep(2.0)  # two more commit intervals: anything extra would show now
        changes, alerts, prepared = _seen(ep.postgres_dsn, names)
        for c in _connectors(names, ep.postgres_dsn, ""):  # the worker's cluster keeps nothing of the run
            urllib.request.urlopen(urllib.request.Request(f"{url}/connectors/{c['name']}", method="DELETE"), timeout=30).close()
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    worker_rc = procs[1].returncode if len(procs) > 1 else None
    aborted = sum(n for k, n in (*changes.items(), *alerts.items()) if k[0] == ABORTED_USER)
    ok = changes == want_changes and alerts == want_alerts and aborted == 0 and prepared == 0 and worker_rc == 0
    print()
    print("verification (each sink read back by itself)")
    print(f"  transactions (committed / aborted)  : {TRANSACTIONS} / 5")
    print(f"  driver SIGKILLed mid-way            : {kills} time(s), then resumed from its checkpoint")
    print(f"  balance changes expected            : {sum(want_changes.values())}")
    print(f"  PostgreSQL rows                     : {sum(changes.values())} ({len(changes)} distinct, "
          f"{sum(n - 1 for n in changes.values())} duplicates, {len(set(want_changes) - set(changes))} missing)")
    print(f"  crossings expected                  : {sum(want_alerts.values())} {sorted(want_alerts)}")
    print(f"  alerts at the HTTP server           : {sum(alerts.values())} {sorted(alerts.elements())}")
    print(f"  rows or alerts of the aborted txn   : {aborted}")
    print(f"  prepared transactions left (PG)     : {prepared}")
    print(f"  worker exit code (SIGTERM)          : {worker_rc}")
    print(f"  total demo time                     : {time.monotonic() - t0:.1f} s")
    print(f"  table {names.table}, HTTP data {names.dir / 'http'}, logs in {names.dir}")
    print("RESULT:", "OK - exactly once" if ok else "FAILED")
    return 0 if ok else 1
