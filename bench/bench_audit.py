"""Benchmark: ``eosink connectors audit`` over a large connector, and what bounds it.

A topic of ``--records`` outbox records (~210 bytes, with the ``eosink.id`` header, in transactions
of the e2e pre-fill) is delivered by a real worker process into PostgreSQL (``fields.kafka``: the
coordinate columns) and S3 (JSON Lines objects on the stack's MinIO) through one fan-out connector
(``--sinks db,s3,files`` adds JSON Lines files); the worker is stopped, then the audit
(:func:`eosink.worker.audit.run.audit`, what ``POST /connectors/{n}/audit`` runs) is timed in this
process, ``--rounds`` times, the best round kept, per phase:

* **source**  reading the outbox read_committed up to the decision log (offsets, ids and, for the
              S3 sink's line comparison, a digest of each value kept);
* **kafka alone** the same read without the digests (what Kafka and the client cost by themselves);
* **db**      reading every row's coordinates (COPY TO STDOUT) and counting them;
* **s3**      listing and fetching every object and matching each line with its record;
* **files**   reading every committed file's envelopes and counting them (when asked);
* **total**   the whole audit, records per second = records / total.

The report must be clean (the worker delivered exactly once); the figures go to
``bench/results/audit.json``, and with ``--publish`` to ``bench/figures/audit.json``.

    python bench/bench_audit.py [--records 1000000] [--partitions 4] [--rounds 2] [--sinks db,s3]
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

from bench import report as published  # noqa: E402
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


def deliver(stack: Any, topic: str, n: int, partitions: int, workdir: Path,
            sinks: Sequence[str]) -> tuple[str, str, dict[str, Any], dict[Any, Any]]:
    """Run a worker until the decision log has every partition at its high watermark; its cluster,
    connector name, config and final decisions."""
    from eosink.worker.control.store import ConnectorStore
    from eosink.worker.engine.zk import ZkSession

    tag = uuid.uuid4().hex[:6]
    cluster, name = f"bench-audit-{tag}", "audit"
    config: dict[str, Any] = {"connector.class": "fanout", "topics": topic, "sinks": ",".join(sinks)}
    if "db" in sinks:
        config |= {"sinks.db.connector.class": "postgres", "sinks.db.connection.url": stack.postgres_dsn,
                   "sinks.db.table.name.format": f"bench_audit_{tag}"}
    if "s3" in sinks:
        config |= {"sinks.s3.connector.class": "s3", "sinks.s3.s3.bucket.name": f"bench-audit-{tag}",
                   "sinks.s3.s3.endpoint.url": stack.s3["endpoint_url"], "sinks.s3.s3.region": stack.s3["region_name"],
                   "sinks.s3.aws.access.key.id": stack.s3["aws_access_key_id"],
                   "sinks.s3.aws.secret.access.key": stack.s3["aws_secret_access_key"]}
    if "files" in sinks:
        config |= {"sinks.files.connector.class": "filesystem", "sinks.files.file.path": str(workdir / "out"),
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
            if proc.poll() is not None or time.perf_counter() - t0 > 3600:
                raise RuntimeError(f"the worker did not deliver {n:,} records; see {workdir / 'worker.log'}")
            time.sleep(1)
        print(f"  delivered {n:,} records into {', '.join(sinks)} in {time.perf_counter() - t0:.1f}s", flush=True)
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


def _drop(stack: Any, config: dict[str, Any]) -> None:
    """The benchmark's table and bucket go with it (the stack's database and MinIO are shared)."""
    table, bucket = config.get("sinks.db.table.name.format"), config.get("sinks.s3.s3.bucket.name")
    if table:
        import psycopg
        from psycopg import sql

        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    if bucket:
        import boto3

        client = boto3.client("s3", **stack.s3)
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if objs:
                    client.delete_objects(Bucket=bucket, Delete={"Objects": objs, "Quiet": True})
            client.delete_bucket(Bucket=bucket)
        except client.exceptions.NoSuchBucket:
            pass


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sinks", default="db,s3", help="the connector's sinks: db (PostgreSQL), s3, files (default db,s3)")
    published.add_arguments(ap)
    args = ap.parse_args(argv)
    sinks = [s for s in args.sinks.split(",") if s]
    if not set(sinks) <= {"db", "s3", "files"}:
        ap.error(f"--sinks: db, s3 or files, not {args.sinks}")
    stack = load_endpoints()
    topic = f"bench-audit-{args.records}-{args.partitions}"
    t0 = time.perf_counter()
    prefill(stack.kafka_bootstrap, topic, args.records, args.partitions, headers=True)
    print(f"  topic {topic} holds {args.records:,} records ({time.perf_counter() - t0:.1f}s)", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    config: dict[str, Any] = {}
    try:
        _cluster, name, config, decisions = deliver(stack, topic, args.records, args.partitions, workdir, sinks)
        rounds = []
        for i in range(args.rounds):
            rounds.append(measure(stack, name, config, decisions))
            print(f"  round {i + 1}: " + json.dumps(rounds[-1]), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        _drop(stack, config)
    best = min(rounds, key=lambda r: r["total_s"])
    print(json.dumps(best, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"best": best, "rounds": rounds, "cpus": os.cpu_count(), "sinks": sinks}, indent=2) + "\n")
    published.maybe_publish(args, lambda: figure(args, best, sinks, argv))
    return 0


TITLE = "Auditing a connector: eosink connectors audit over PostgreSQL and S3"
MEASURES = ("Records/s of each phase of one audit (the outbox read read_committed, each sink read back and counted) "
            "and of the whole audit, over a connector that delivered every record into each sink.")
BASELINE = "reading the same outbox records read_committed alone (no digest kept, no sink read), in the same run"
SINK_NAMES = {"db": "PostgreSQL (COPY of the coordinate columns)", "s3": "S3 (every object fetched, each line matched)",
              "files": "files (each line's envelope)"}


def figure(args: argparse.Namespace, best: dict[str, Any], sinks: Sequence[str], argv: Any) -> dict[str, Any]:
    n = best["records"]
    kafka = n / best["kafka_alone_s"]
    rows = [published.row("reading the outbox alone (Kafka, read_committed)", round(kafka), baseline=True),
            published.row("the audit's source read (offsets, ids, value digests)", best["source_records_per_s"], kafka,
                          note=f"{best['source_s']:.1f} s")]
    rows += [published.row(f"sink: {SINK_NAMES[s]}", best[f"{s}_records_per_s"], kafka, note=f"{best[f'{s}_s']:.1f} s")
             for s in sinks]
    rows.append(published.row("the whole audit", best["records_per_s"], kafka, note=f"{best['total_s']:.1f} s, clean"))
    conditions = (f"{n:,} outbox records of ~210 bytes with the eosink.id header in {args.partitions} partitions, delivered "
                  f"by one worker into {', '.join(sinks)} (stack's PostgreSQL and MinIO on the same machine), then audited "
                  f"in-process, best of {args.rounds} rounds; {published.load_note()} at the end (the machine is shared)")
    return published.figure("audit", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions,
                            unit="records/s", rows=rows, targets=[], argv=argv, make_target="bench-audit")


if __name__ == "__main__":
    sys.exit(main())
