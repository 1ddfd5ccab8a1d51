"""Benchmark: eosink against the peer connectors, on the same topic, servers and machine, in one run.

1. Kafka -> PostgreSQL: Debezium's JDBC sink (``io.debezium:debezium-connector-jdbc`` 3.3.1.Final on
   Kafka Connect 4.1.1 standalone, one task) against one ``eosink worker`` with a ``postgres``
   connector (one task), in insert mode and in upsert mode (primary key ``id`` from the value).
2. Kafka -> Iceberg: Apache Iceberg's Kafka Connect sink (``iceberg-kafka-connect`` 1.10.1, one task)
   against an ``iceberg`` connector in one worker, the same JDBC catalog in the stack's PostgreSQL,
   the same MinIO warehouse and the same commit interval.

The topic holds ``--records`` records of Kafka Connect's JSON envelope (``JsonConverter``,
``schemas.enable=true``: Debezium needs a schema; eosink reads it with
``value.converter.schemas.enable=true``), pre-filled transactionally; every side reads it from the
beginning with read_committed into a table of its own. ``--formats json,avro`` (the default) runs the
PostgreSQL comparisons on a second topic too: the same orders as Avro in Confluent's wire format, the
schema in the stack's Schema Registry, read by Debezium through Apicurio's ``AvroConverter`` (2.6.13,
Confluent's is not on Maven Central; jars from worker/stack/jvm/apicurio-converter/pom.xml on the
Connect worker's classpath) and by eosink with ``value.converter=io.confluent.connect.avro.AvroConverter``.
Each side's process is started with no connector; the clock starts at the connector's POST to its REST API and stops when every record is
visible to a reader (``SELECT count(*)``; the Iceberg table's current snapshot), polled every
``--poll-s``. Afterwards every table is checked: exactly the ids 0..N-1, each once (PostgreSQL: and
every row's values those of the order published). Reported per
side: rows/s, CPU per row (user + system of its process, every thread, from the POST), peak RSS
(VmHWM); Iceberg also data files and snapshots; and eosink / peer for each.

Debezium is tuned as its documentation advises for throughput: ``batch.size=5000`` with the worker's
``consumer.max.poll.records=5000`` (it flushes at the end of every ``put()``), and the JDBC URL's
``reWriteBatchedInserts=true``. Both Connect peers run with the JVM options of Kafka's own scripts.

    python bench/bench_peers.py [--records 1000000] [--partitions 4] [--only postgres|iceberg]
        [--modes insert,upsert] [--formats json,avro] [--commit-interval-ms 5000] [--publish]

Needs the local stack (``eosink stack up``, or EOSINK_HOME pointing at a running one), ``java`` 17+ and,
once, ``mvn`` (the plugins' jars are resolved into the cache from worker/stack/jvm/*/pom.xml).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _peers_setup as setup  # noqa: E402
from bench import report  # noqa: E402
from bench._peers_proc import Run, run_connect, run_eosink  # noqa: E402
from bench.bench_worker import delete_groups  # noqa: E402

RESULTS = REPO / "bench" / "results" / "peers.json"
CONNECT_WORKER = {"consumer.max.poll.records": setup.DEBEZIUM_BATCH}
TARGETS = {"postgres": (4.0, 0.25), "iceberg": (2.0, None)}  # rows/s at least x the peer's; CPU/row at most x
FORMATS = {"json": "JSON", "avro": "Avro"}


def postgres_pair(ep: Any, topic: str, n: int, mode: str, fmt: str, tag: str, workdir: Path,
                  args: argparse.Namespace) -> list[Run]:
    """Debezium's JDBC sink, then eosink, each into a fresh table in ``mode``, reading ``topic`` of ``fmt``
    (json: the Connect envelope; avro: Confluent's wire format through the registry)."""
    registry = ep.registry_url if fmt == "avro" else None
    worker = CONNECT_WORKER | (setup.connect_avro_worker(ep.registry_url) if registry else {})
    out = []
    for side in ("debezium", "eosink"):
        table = f"peers_{tag}_{side}_{mode}_{fmt}"
        pg = setup.PgTable(ep.postgres_dsn, table)
        name = f"peers-{tag}-{side}-{mode}-{fmt}"
        label = f"{mode}, {FORMATS[fmt]}"
        try:
            print(f"  {side} {mode} {fmt} ...", end="", flush=True)
            if side == "debezium":
                run = run_connect(f"Debezium JDBC sink, {label}", "debezium-jdbc", worker,
                                  setup.debezium_config(name, ep.postgres_dsn, topic, table, mode), ep.kafka_bootstrap,
                                  workdir, n, pg.count, args.poll_s, args.timeout_s,
                                  classpath=("apicurio-converter",) if registry else ())
            else:
                run = run_eosink(f"eosink postgres, {label}", ep, name,
                                 setup.eosink_pg_config(ep.postgres_dsn, topic, table, mode, registry),
                                 workdir, n, pg.count, args.poll_s, args.timeout_s)
            run.check = pg.check(n)
            run.extra |= {"mode": mode, "format": fmt, "side": side}
            print(f" {run.seconds:.1f}s, {run.rate:,.0f} rows/s, {run.cpu_us_per_row:.1f} CPU us/row, "
                  f"peak RSS {run.peak_rss_mb:.0f} MB [{run.check}]")
            out.append(run)
        finally:
            if not args.keep:
                if side == "eosink":
                    pg.forget(name)
                pg.drop()
            delete_groups(ep.kafka_bootstrap, [f"connect-{name}", f"eosink-{name}"])
    return out


def iceberg_pair(ep: Any, topic: str, n: int, tag: str, workdir: Path, args: argparse.Namespace) -> list[Run]:
    """Iceberg's Kafka Connect sink, then eosink, each into a fresh table of one catalog and warehouse."""
    warehouse = f"s3://eosink-bench/peers-{tag}"
    out = []
    with setup.iceberg_catalog(ep, warehouse) as catalog:
        for side in ("iceberg-connect", "eosink"):
            ident = f"{setup.NAMESPACE}.{side.replace('-', '_')}_{tag}"
            table = setup.IcebergTable(catalog, ident)
            name = f"peers-{tag}-{side}"
            groups = [f"connect-{name}", f"eosink-{name}", f"connect-{name}-coord", f"cg-control-{name}"]
            control = f"peers-control-{tag}"  # fresh per run: a reused one lost rows silently
            try:
                print(f"  {side} iceberg ...", end="", flush=True)
                if side == "iceberg-connect":
                    setup.create_topic(ep.kafka_bootstrap, control)
                    cfg = setup.iceberg_connect_config(name, ep, topic, ident, warehouse, control, args.commit_interval_ms)
                    run = run_connect("Iceberg Kafka Connect sink", "iceberg-connect", CONNECT_WORKER, cfg,
                                      ep.kafka_bootstrap, workdir, n, table.count, args.poll_s, args.timeout_s)
                else:
                    cfg = setup.eosink_iceberg_config(ep, topic, ident, warehouse, args.commit_interval_ms)
                    run = run_eosink("eosink iceberg", ep, name, cfg, workdir, n, table.count, args.poll_s, args.timeout_s)
                run.check, stats = table.check(n)
                run.extra |= {"mode": "iceberg", "side": side, **stats}
                print(f" {run.seconds:.1f}s, {run.rate:,.0f} rows/s, {run.cpu_us_per_row:.1f} CPU us/row, "
                      f"peak RSS {run.peak_rss_mb:.0f} MB, {stats['data_files']} files, {stats['snapshots']} snapshots "
                      f"[{run.check}]")
                out.append(run)
            finally:
                if not args.keep:
                    table.drop()
                delete_groups(ep.kafka_bootstrap, groups)
                if side == "iceberg-connect":
                    setup.create_topic(ep.kafka_bootstrap, control, delete=True)
    return out


def targets_of(pairs: list[tuple[str, Run, Run]]) -> list[dict[str, Any]]:
    out = []
    for mode, peer, eos in pairs:
        rate_goal, cpu_goal = TARGETS["iceberg" if mode == "iceberg" else "postgres"]
        ratio = eos.rate / peer.rate
        out.append(report.target(f"{mode}: eosink rows/s / {peer.name}'s", f">= {rate_goal:g}x", f"{ratio:.2f}x",
                                 ratio >= rate_goal))
        if cpu_goal is not None:
            cpu = eos.cpu_us_per_row / peer.cpu_us_per_row
            out.append(report.target(f"{mode}: eosink CPU per row / {peer.name}'s", f"<= {cpu_goal:g}x", f"{cpu:.2f}x",
                                     cpu <= cpu_goal))
    return out


def figure_rows(pairs: list[tuple[str, Run, Run]]) -> list[dict[str, Any]]:
    """Each peer is the baseline of the eosink row under it (ratio = eosink / that peer)."""
    rows = []
    for mode, peer, eos in pairs:
        for run, base in ((peer, None), (eos, peer)):
            note = f"{run.seconds:.1f} s, peak RSS {run.peak_rss_mb:.0f} MB"
            if mode == "iceberg":
                note += f", {run.extra['data_files']} data files, {run.extra['snapshots']} snapshots"
            if base is not None:
                note += f"; CPU per row {run.cpu_us_per_row / base.cpu_us_per_row:.2f}x the peer's"
            rows.append(report.row(run.name, round(run.rate), base.rate if base else None, cpu_us=run.cpu_us_per_row,
                                   baseline=base is None, note=note))
    return rows


TITLE = "Against the peer connectors: Debezium's JDBC sink and Iceberg's Kafka Connect sink"
MEASURES = ("Rows/s from the connector's POST to the last row visible (PostgreSQL: SELECT count(*); Iceberg: the "
            "current snapshot), each side one task in its own process reading the same topic: Kafka Connect JSON "
            "envelopes, or (Avro) the same records in Confluent's wire format through the stack's Schema Registry; "
            "every table checked (each id once; PostgreSQL: every row's values).")
BASELINE = "the peer connector of the same mode, on Kafka Connect 4.1.1 standalone, in the same run"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--only", choices=("postgres", "iceberg"), default=None)
    ap.add_argument("--modes", default="insert,upsert",
                    help="PostgreSQL comparisons to run, comma-separated: insert, upsert (all of them to --publish)")
    ap.add_argument("--formats", default="json,avro",
                    help="PostgreSQL comparisons' topics, comma-separated: json (Connect envelopes), avro (Confluent's wire "
                         "format); Iceberg reads the JSON one")
    ap.add_argument("--commit-interval-ms", type=int, default=5000, help="Iceberg: both sides' commit interval")
    ap.add_argument("--poll-s", type=float, default=0.25)
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ap.add_argument("--keep", action="store_true", help="keep the tables and the processes' logs")
    ap.add_argument("--out", type=Path, default=RESULTS)
    report.add_arguments(ap)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the JVM and the worker on the way out

    from eosink.worker.stack import load_endpoints

    modes = [m for m in ("insert", "upsert") if m in args.modes.split(",")]
    if not modes or set(args.modes.split(",")) - {"insert", "upsert"}:
        ap.error(f"--modes: a comma-separated subset of insert,upsert, not {args.modes!r}")
    formats = [f for f in FORMATS if f in args.formats.split(",")]
    if not formats or set(args.formats.split(",")) - set(FORMATS):
        ap.error(f"--formats: a comma-separated subset of json,avro, not {args.formats!r}")
    ep = load_endpoints()
    n = args.records
    topic = f"bench-peers-envelope-{n}-{args.partitions}p"
    topics = {"json": topic, "avro": f"bench-peers-avro-{n}-{args.partitions}p"}
    tag = uuid.uuid4().hex[:6]
    print(f"peer connectors benchmark: {n:,} records, topic {topic}, Kafka {ep.kafka_bootstrap}")
    setup.prefill(ep.kafka_bootstrap, topic, n, args.partitions)
    value_bytes = {"json": len(setup.envelope(n // 2))}
    if "avro" in formats and args.only in (None, "postgres"):
        if ep.registry_url is None:
            ap.error("--formats avro needs the stack's Schema Registry (registry.url in endpoints.json)")
        avro = setup.avro_value(ep.registry_url, topics["avro"])
        setup.prefill(ep.kafka_bootstrap, topics["avro"], n, args.partitions, avro)
        value_bytes["avro"] = len(avro(n // 2))
    workdir = Path(tempfile.mkdtemp(prefix="eosink-peers-"))
    load = [os.getloadavg()[0]]
    pairs: list[tuple[str, Run, Run]] = []
    try:
        if args.only in (None, "postgres"):
            for mode in modes:
                for fmt in formats:
                    os.sync()
                    peer, eos = postgres_pair(ep, topics[fmt], n, mode, fmt, tag, workdir, args)
                    pairs.append((f"{mode}, {FORMATS[fmt]}", peer, eos))
                    load.append(os.getloadavg()[0])
        if args.only in (None, "iceberg"):
            os.sync()
            peer, eos = iceberg_pair(ep, topic, n, tag, workdir, args)
            pairs.append(("iceberg", peer, eos))
            load.append(os.getloadavg()[0])
    finally:
        if args.keep:
            print(f"  logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(f"{'side':40s} {'seconds':>8s} {'rows/s':>9s} {'CPU us/row':>10s} {'RSS MB':>7s}  eosink/peer (rows/s, CPU/row)")
    for _mode, peer, eos in pairs:
        for r in (peer, eos):
            vs = f"  {eos.rate / peer.rate:.2f}x, {eos.cpu_us_per_row / peer.cpu_us_per_row:.2f}x" if r is eos else ""
            print(f"{r.name:40s} {r.seconds:>8.1f} {r.rate:>9,.0f} {r.cpu_us_per_row:>10.1f} {r.peak_rss_mb:>7.0f}{vs}")
    loads = " -> ".join(f"{x:.1f}" for x in load)
    print(f"(1-min load {loads} on {os.cpu_count()} CPUs)")
    targets = targets_of(pairs)
    for t in targets:
        print(f"  target {t['what']} {t['target']}: {t['result']} {'met' if t['met'] else 'MISSED'}")
    runs = [r for _, p, e in pairs for r in (p, e)]
    ok = all(r.check.startswith("ok") for r in runs)
    print(f"correctness: {'every table holds exactly the N ids, each once (PostgreSQL: the values published)' if ok else 'FAILED'}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "bench/bench_peers.py", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "config": {"records": n, "topics": {f: topics[f] for f in value_bytes}, "partitions": args.partitions,
                   "value_bytes": value_bytes, "avro_converter": setup.APICURIO_CONVERTER,
                   "commit_interval_ms": args.commit_interval_ms, "debezium_batch": setup.DEBEZIUM_BATCH},
        "load_average_1m": [round(x, 2) for x in load],
        "results": [{**asdict(r), "rows_per_s": round(r.rate), "cpu_us_per_row": round(r.cpu_us_per_row, 2)} for r in runs],
        "targets": targets, "correct": ok,
    }, indent=2) + "\n")
    print(f"results: {args.out}")
    sizes = " or ".join(f"~{b} bytes ({'JSON envelope with its schema' if f == 'json' else 'Avro, wire format'})"
                        for f, b in value_bytes.items())
    conditions = (f"{n:,} records of {sizes} in {args.partitions} partitions; "
                  f"one task each side; Iceberg commit interval {args.commit_interval_ms} ms on both; Debezium batch.size "
                  f"and consumer.max.poll.records {setup.DEBEZIUM_BATCH}, reWriteBatchedInserts=true, Avro through Apicurio's "
                  f"AvroConverter {setup.APICURIO_VERSION}; 1-min load {loads} "
                  f"on {os.cpu_count()} CPUs")
    if ok and len(pairs) == 2 * len(FORMATS) + 1:  # every mode, every format, and Iceberg
        report.maybe_publish(args, lambda: report.figure(
            "peers", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="rows/s",
            rows=figure_rows(pairs), targets=targets, argv=argv))
    elif args.publish:
        print("not published: a table failed its check, or a comparison was left out (--only, --modes, --formats)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
