"""Benchmark: ``eosink connectors audit`` over a large connector, and what bounds it.

A topic of ``--records`` outbox records (~210 bytes, with the ``eosink.id`` header, in transactions
of the e2e pre-fill) is delivered by a real worker process into PostgreSQL (``fields.kafka``: the
coordinate columns) and JSON Lines files through one fan-out connector; the worker is stopped,
then the audit (:func:`eosink.worker.audit.run.audit`, what ``POST /connectors/{n}/audit`` runs)
is timed in this process, ``--rounds`` times, the best round kept:

* **source**  reading the outbox read_committed up to the decision log (offsets and ids kept);
* **db**      reading every row's coordinates (COPY TO STDOUT) and counting them;
* **files**   reading every committed file's envelopes and counting them;
* **total**   the whole audit, records per second = records / total.

The report must be clean (the worker delivered exactly once); the figures go to
``bench/results/audit.json``.

    python bench/bench_audit.py [--records 1000000] [--partitions 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_e2e import prefill  # noqa: E402
from bench.bench_worker import watermarks  # noqa: E402
from eosink.worker.stack.endpoints import load_endpoints  # noqa: E402

RESULTS = REPO / "bench" / "results" / "audit.json"


def _decisions(zk_hosts: str, cluster: str, name: str) -> dict[Any, Any]:
    from eosink.worker.control.admin import ClusterAdmin
    from eosink.worker.engine.zk import ZkSession

    session = ZkSession(zk_hosts, cluster).start()
    try:
        return ClusterAdmin(session).decisions(name)
    finally:
        session.stop()


def deliver(stack: Any, topic: str, n: int, partitions: int, workdir: Path) -> tuple[str, str, dict[str, Any], dict[Any, Any]]:
    """Run a worker until the decision log has every partition at its high watermark; its cluster,
    connector name, config and final decisions."""
    from eosink.worker.control.store import ConnectorStore
    from eosink.worker.engine.zk import ZkSession

    cluster, name = f"bench-audit-{uuid.uuid4().hex[:6]}", "audit"
    table = f"bench_audit_{uuid.uuid4().hex[:6]}"
    config = {"connector.class": "fanout", "topics": topic, "sinks": "db,files",
              "sinks.db.connector.class": "postgres", "sinks.db.connection.url": stack.postgres_dsn,
              "sinks.db.table.name.format": table,
              "sinks.files.connector.class": "filesystem", "sinks.files.file.path": str(workdir / "out"),
              "sinks.files.file.fsync": "false"}
    session = ZkSession(stack.zookeeper_hosts, cluster).start()
    try:
        ConnectorStore(session).put(name, config)
    finally:
        session.stop()
    want = {p: h for p, (_, h) in enumerate(watermarks(stack.kafka_bootstrap, topic, partitions) or [])}
    log = open(workdir / "worker.log", "wb")  # noqa: SIM115 - the worker writes it for its whole life
    proc = subprocess.Popen([sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--bootstrap-servers",
                             stack.kafka_bootstrap, "--zookeeper", stack.zookeeper_hosts, "--cluster", cluster,
                             "--worker-id", "w-bench", "--rest-port", "0", "--metrics-port", "0"],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.perf_counter()
    try:
        while True:
            d = _decisions(stack.zookeeper_hosts, cluster, name)
            # The high watermark counts the last transaction's commit marker, which the decision may not.
            if len(d) == partitions and all((e.next_offset or 0) >= want[tp.partition] - 1 for tp, e in d.items()):
                break
            if proc.poll() is not None or time.perf_counter() - t0 > 900:
                raise RuntimeError(f"the worker did not deliver {n:,} records; see {workdir / 'worker.log'}")
            time.sleep(1)
        print(f"  delivered {n:,} records into PostgreSQL and files in {time.perf_counter() - t0:.1f}s")
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    return cluster, name, config, d


def measure(stack: Any, name: str, config: dict[str, Any], decisions: dict[Any, Any]) -> dict[str, Any]:
    from eosink.worker.audit import source as src
    from eosink.worker.audit.run import audit

    report = audit(name, config, decisions, bootstrap=stack.kafka_bootstrap)
    if not report["ok"]:
        raise RuntimeError(f"the audit is not clean: {json.dumps(report)[:2000]}")
    n = report["source"]["records"]
    windows = {tp: src.Window(0, e.next_offset) for tp, e in decisions.items()}
    t0 = time.perf_counter()
    only = src.read(stack.kafka_bootstrap, {}, windows)
    kafka_only = time.perf_counter() - t0
    assert only.records == n
    sinks = {s["sink"]: s["seconds"] for s in report["sinks"]}
    return {"records": n, "total_s": report["seconds"], "source_s": report["source"]["seconds"],
            "kafka_alone_s": round(kafka_only, 3), **{f"{k}_s": v for k, v in sinks.items()},
            "records_per_s": round(n / report["seconds"]),
            "source_records_per_s": round(n / report["source"]["seconds"]),
            **{f"{k}_records_per_s": round(n / v) for k, v in sinks.items()}}


def _drop(dsn: str, table: str) -> None:
    """The benchmark's table goes with it (the stack's database is shared)."""
    if not table:
        return
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    stack = load_endpoints()
    topic = f"bench-audit-{args.records}-{args.partitions}"
    prefill(stack.kafka_bootstrap, topic, args.records, args.partitions, headers=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    try:
        _cluster, name, config, decisions = deliver(stack, topic, args.records, args.partitions, workdir)
        rounds = [measure(stack, name, config, decisions) for _ in range(args.rounds)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        _drop(stack.postgres_dsn, str(locals().get("config", {}).get("sinks.db.table.name.format", "")))
    best = min(rounds, key=lambda r: r["total_s"])
    print(json.dumps(best, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"best": best, "rounds": rounds, "cpus": os.cpu_count()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
