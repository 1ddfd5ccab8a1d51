"""Benchmark: the PostgreSQL sink's full 2PC cycle against a raw COPY and an executemany consumer.

Measured in one run, on the same ~200-byte JSON records, each mode into its own fresh table
of the same shape (9 value columns + the Kafka coordinates, no index):

(a) raw COPY - rows already built as tuples, binary COPY + COMMIT per batch: the ceiling.
    Also raw text COPY, to show why the sink picks binary where it can.
(b) the sink - begin_transaction / write / pre_commit / commit per batch of ``--batch`` records
    (what one commit.interval.ms=1000 cycle holds at the target rate): row building from the
    record dicts, type checks, manifest, fence, COPY, PREPARE and COMMIT PREPARED all included.
(c) at-least-once baseline - a plain consumer building rows from the same dicts and running
    ``executemany(INSERT ...)`` + COMMIT per batch.

(d) deletes (``--deletes N``, default 200,000; 0 skips) - a sink with ``delete.enabled=true``,
    ``pk.mode=record_key`` loads N keyed rows (a PRIMARY KEY on id) in ``--batch`` cycles, then
    deletes them all with tombstone cycles: the key COPY into the staging table, ``DELETE ...
    USING`` and the 2PC, timed per phase. Run once, after the rounds.

Record generation is outside every timing, and the generated records are frozen out of the
cyclic GC (a worker holds one batch, not a million records). Raw COPY and the sink alternate
for ``--rounds`` rounds and the best round of each counts (the machine is shared; the spread
is printed). The baseline stops after ``--baseline-budget-s``; its rate is over what it did.
The sink's table is auto-created by a warm-up cycle outside the timing, as in a running worker.

    python bench/bench_postgres_sink.py [--dsn postgresql://...] [--records 1000000] [--batch 50000]

The DSN defaults to $EOSINK_BENCH_DSN, else the local stack's (``eosink stack up``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from bench import report  # noqa: E402
from bench._data import batches, make_records  # noqa: E402
from eosink.connectors.api.records import SinkRecord, TxnManifest  # noqa: E402
from eosink.connectors.postgres.sink import PostgresSink  # noqa: E402

PARTITIONS = 4
FIELDS: tuple[tuple[str, str, str], ...] = (  # name, SQL type, COPY type
    ("id", "bigint", "int8"),
    ("user", "text", "text"),
    ("email", "text", "text"),
    ("amount", "double precision", "float8"),
    ("currency", "text", "text"),
    ("status", "text", "text"),
    ("country", "text", "text"),
    ("created", "text", "text"),
    ("note", "text", "text"),
)
KAFKA = (("__topic", "text", "text"), ("__partition", "integer", "int4"), ("__offset", "bigint", "int8"))
COLUMNS = [f for f, _, _ in FIELDS + KAFKA]
COPY_TYPES = [t for _, _, t in FIELDS + KAFKA]


@dataclass
class Result:
    name: str
    records: int = 0
    seconds: float = 0.0
    rounds: list[float] = field(default_factory=list)  # records/s per round
    cpu_s: float = 0.0  # this process's CPU seconds in the best round (the server's are not counted)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def create_table(conn: psycopg.Connection[Any], name: str) -> None:
    cols = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t, _ in FIELDS + KAFKA)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(name), cols))
    conn.commit()


def count(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name))).fetchone()
    conn.commit()
    return int(row[0]) if row else -1


def run_raw_copy(dsn: str, table: str, parts: list[Sequence[SinkRecord]], binary: bool) -> tuple[float, float]:
    """Seconds (wall, client CPU) to COPY pre-built tuples of every batch, one COPY + COMMIT per batch."""
    getter = itemgetter(*[f for f, _, _ in FIELDS])
    prebuilt = [[getter(r.value) + (r.topic, r.partition, r.offset) for r in part] for part in parts]
    stmt = sql.SQL("COPY {} ({}) FROM STDIN" + (" (FORMAT BINARY)" if binary else "")).format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    )
    with psycopg.connect(dsn) as conn:
        create_table(conn, table)
        t0, c0 = time.perf_counter(), time.process_time()
        for rows in prebuilt:
            with conn.cursor() as cur, cur.copy(stmt) as cp:
                cp.set_types(COPY_TYPES)
                write = cp.write_row
                for row in rows:
                    write(row)
            conn.commit()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert count(conn, table) == sum(map(len, prebuilt)), "raw COPY lost rows"
    return elapsed, cpu


def run_sink(
    dsn: str, topic: str, connector: str, parts: list[Sequence[SinkRecord]], cycles: list[dict[str, float]]
) -> tuple[float, float]:
    """Seconds (wall, client CPU) for full sink cycles over every batch (table auto-created by a warm-up)."""
    sink = PostgresSink(connector, {"connection.url": dsn})
    sink.open()
    try:
        warm = make_records(topic, 1, PARTITIONS)  # auto.create outside the timing, as in a long-running worker
        sink.begin_transaction(f"{connector}.w.0.0")
        sink.write(warm)
        sink.pre_commit(TxnManifest.covering(f"{connector}.w.0.0", connector, warm, 1))
        sink.abort(f"{connector}.w.0.0")
        manifests = [TxnManifest.covering(f"{connector}.w.1.{i + 1}", connector, part, 1) for i, part in enumerate(parts)]
        t0, c0 = time.perf_counter(), time.process_time()
        for part, m in zip(parts, manifests):
            sink.begin_transaction(m.txn_id)
            sink.write(part)
            sink.pre_commit(m)
            sink.commit(m.txn_id)
            t = sink.timings
            cycles.append({"manifest": t.manifest_ms, "write": t.write_ms, "prepare": t.prepare_ms, "commit": t.commit_ms})
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        sink.close()
    return elapsed, cpu


def run_deletes(dsn: str, topic: str, connector: str, n: int, batch: int) -> tuple[float, float]:
    """Seconds to load ``n`` keyed rows and to delete them again with tombstones, full 2PC cycles each."""
    loads = [SinkRecord(r.topic, r.partition, r.offset, str(r.value["id"]).encode(), r.value, r.raw_value)
             for r in make_records(topic, n, PARTITIONS)]
    tombs = [SinkRecord(r.topic, r.partition, r.offset + n, r.key, None, None) for r in loads]
    sink = PostgresSink(connector, {"connection.url": dsn, "delete.enabled": "true", "pk.mode": "record_key", "pk.fields": "id"})
    sink.open()
    seq = 0

    def run(records: Sequence[SinkRecord]) -> float:
        nonlocal seq
        t0 = time.perf_counter()
        for part in batches(records, batch):
            seq += 1
            m = TxnManifest.covering(f"{connector}.w.1.{seq}", connector, part, 1)
            sink.begin_transaction(m.txn_id)
            sink.write(part)
            sink.pre_commit(m)
            sink.commit(m.txn_id)
        return time.perf_counter() - t0

    try:
        load_s = run(loads)
        delete_s = run(tombs)
    finally:
        sink.close()
    return load_s, delete_s


def run_executemany(dsn: str, table: str, parts: list[Sequence[SinkRecord]], budget_s: float) -> tuple[int, float, float]:
    """Records, seconds and client CPU of an at-least-once consumer (executemany + COMMIT per batch)."""
    getter = itemgetter(*[f for f, _, _ in FIELDS])
    stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, COLUMNS)), sql.SQL(", ").join([sql.Placeholder()] * len(COLUMNS))
    )
    done = 0
    with psycopg.connect(dsn) as conn:
        create_table(conn, table)
        t0, c0 = time.perf_counter(), time.process_time()
        for part in parts:
            rows = [getter(r.value) + (r.topic, r.partition, r.offset) for r in part]
            with conn.cursor() as cur:
                cur.executemany(stmt, rows)
            conn.commit()
            done += len(part)
            if time.perf_counter() - t0 > budget_s:
                break
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert count(conn, table) == done, "executemany lost rows"
    return done, elapsed, cpu


TITLE = "PostgreSQL sink: full 2PC cycles against a raw COPY"
MEASURES = ("Records/s of the PostgreSQL sink's full cycle (rows, manifest, fence, COPY, PREPARE, COMMIT PREPARED) on "
            "~200-byte JSON records, against a raw binary COPY of the same rows and an at-least-once executemany.")
BASELINE = "a raw binary COPY of the same rows, pre-built as tuples, one COPY + COMMIT per batch, in the same run"


def figure_rows(raw: Result, raw_text: Result, sink: Result, alo: Result, overhead_ms: float | None) -> list[dict[str, Any]]:
    """The ceiling, the text COPY, the sink (with its 2PC overhead per cycle) and the executemany baseline."""
    def cpu(r: Result) -> float:
        return r.cpu_s / r.records * 1e6

    overhead = f"; 2PC overhead {overhead_ms:.1f} ms per cycle" if overhead_ms is not None else ""
    return [
        report.row("raw binary COPY, pre-built rows (ceiling)", round(raw.rate), baseline=True, cpu_us=cpu(raw)),
        report.row("raw text COPY, pre-built rows", round(raw_text.rate), raw.rate, cpu_us=cpu(raw_text)),
        report.row("eosink PostgreSQL sink, full 2PC cycle", round(sink.rate), raw.rate, cpu_us=cpu(sink),
                   note=f"{sink.rate / alo.rate:.1f}x executemany{overhead}"),
        report.row("executemany INSERT, at-least-once", round(alo.rate), raw.rate, cpu_us=cpu(alo),
                   note="what users write by hand"),
    ]


def default_dsn() -> str:
    if os.environ.get("EOSINK_BENCH_DSN"):
        return os.environ["EOSINK_BENCH_DSN"]
    from eosink.worker.stack import load_endpoints

    return load_endpoints().postgres_dsn


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: $EOSINK_BENCH_DSN or the local stack)")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=50_000, help="records per cycle")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of raw COPY and the sink")
    ap.add_argument("--baseline-budget-s", type=float, default=15.0, help="stop the executemany baseline after this long")
    ap.add_argument("--deletes", type=int, default=200_000, help="keyed rows loaded then deleted by tombstones (0: skip)")
    ap.add_argument("--keep", action="store_true", help="keep the tables")
    ap.add_argument("--no-gc-freeze", action="store_true", help="leave the generated records to the cyclic GC")
    report.add_arguments(ap)
    args = ap.parse_args(argv)
    dsn = args.dsn or default_dsn()
    tag = uuid.uuid4().hex[:6]
    topic = f"bench.pg.{tag}"
    raw_table, text_table, alo_table = f"bench_raw_{tag}", f"bench_rawtext_{tag}", f"bench_alo_{tag}"

    t0 = time.perf_counter()
    records = make_records(topic, args.records, PARTITIONS)
    avg_bytes = statistics.fmean(len(r.raw_value or b"") for r in records[:10_000])
    parts = batches(records, args.batch)
    if not args.no_gc_freeze:
        # A worker holds one cycle's batch; this process holds all of them. Without freezing, every
        # full collection walks a million live records, a cost no worker pays: keep it out.
        gc.collect()
        gc.freeze()
    print(f"{len(records):,} records of ~{avg_bytes:.0f} bytes JSON in {len(parts)} batches of {args.batch:,}; "
          f"generated in {time.perf_counter() - t0:.1f}s; PostgreSQL {dsn.rsplit('@', 1)[-1]}")

    raw = Result("raw COPY binary (ceiling)")
    raw_text = Result("raw COPY text")
    sink = Result("eosink PostgresSink, 2PC cycle")
    cycles: list[dict[str, float]] = []
    tables: list[str] = [raw_table, text_table, alo_table]
    for rnd in range(args.rounds):
        runs: list[tuple[Result, Callable[[], tuple[float, float]]]] = [
            (raw, lambda: run_raw_copy(dsn, raw_table, parts, True)),
            (raw_text, lambda: run_raw_copy(dsn, text_table, parts, False)),
            (sink, functools.partial(run_sink, dsn, topic, f"bench{tag}r{rnd}", parts, cycles)),
        ]
        for res, fn in runs:
            secs, cpu = fn()
            res.rounds.append(len(records) / secs)
            if not res.seconds or secs < res.seconds:
                res.records, res.seconds, res.cpu_s = len(records), secs, cpu
        tables.append(f"bench_pg_{tag}")
        if rnd < args.rounds - 1:  # the sink appends to its auto-created table: start the next round empty
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(f"bench_pg_{tag}")))
    alo = Result("executemany INSERT (at-least-once)")
    alo.records, alo.seconds, alo.cpu_s = run_executemany(dsn, alo_table, parts, args.baseline_budget_s)
    alo.rounds.append(alo.rate)

    print()
    print(f"{'mode':36s} {'records':>10s} {'seconds':>8s} {'records/s':>11s} {'vs raw COPY':>12s} {'vs executemany':>15s}"
          f" {'client CPU':>11s}   rounds (records/s)")
    for res in (raw, raw_text, sink, alo):
        print(f"{res.name:36s} {res.records:>10,} {res.seconds:>8.2f} {res.rate:>11,.0f} {res.rate / raw.rate:>11.0%} "
              f"{res.rate / alo.rate:>14.1f}x {res.cpu_s / res.records * 1e6:>7.2f} us/r   {', '.join(f'{x:,.0f}' for x in res.rounds)}")
    print(f"(load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs: "
          "client and server share them, so a loaded machine lowers every rate and the ratios with it)")
    overhead_ms = None
    if cycles:
        def med(k: str) -> float:
            return statistics.median(c[k] for c in cycles)

        overhead_ms = med("manifest") + med("prepare") + med("commit")

        print()
        print(f"per cycle of {args.batch:,} records (median of {len(cycles)}): manifest write {med('manifest'):.2f} ms, "
              f"fence + COPY {med('write'):.1f} ms, PREPARE {med('prepare'):.2f} ms, COMMIT PREPARED {med('commit'):.2f} ms; "
              f"2PC overhead (manifest + PREPARE + COMMIT PREPARED) {med('manifest') + med('prepare') + med('commit'):.2f} ms")
    deletes = ""
    if args.deletes:
        load_s, delete_s = run_deletes(dsn, f"bench.pgdel.{tag}", f"bench{tag}d", args.deletes, args.batch)
        tables.append(f"bench_pgdel_{tag}")
        print()
        print(f"delete.enabled, pk.mode=record_key (PRIMARY KEY id), {args.deletes:,} keys in cycles of {args.batch:,}: "
              f"load {args.deletes / load_s:,.0f} records/s, tombstones {args.deletes / delete_s:,.0f} deletes/s")
        deletes = (f"; delete.enabled: {args.deletes:,} keyed rows loaded at {args.deletes / load_s:,.0f} records/s, "
                   f"deleted by tombstones at {args.deletes / delete_s:,.0f}/s")
    print()
    targets = [
        report.target("sink rate", ">= 100,000 records/s", f"{sink.rate:,.0f} records/s", sink.rate >= 100_000),
        report.target("sink vs raw binary COPY", ">= 50% of raw COPY", f"{sink.rate / raw.rate:.0%}", sink.rate >= 0.5 * raw.rate),
        report.target("sink vs executemany", ">= 3x executemany", f"{sink.rate / alo.rate:.1f}x", sink.rate >= 3 * alo.rate),
    ]
    print("targets: " + "; ".join(f"{t['target']}: {'met' if t['met'] else 'MISSED'}" for t in targets))
    conditions = (f"{len(records):,} records of ~{avg_bytes:.0f} bytes JSON, {args.batch:,} per cycle, best of {args.rounds} "
                  f"rounds; CPU is this process's, not PostgreSQL's; {report.load_note()}{deletes}")
    report.maybe_publish(args, lambda: report.figure(
        "postgres", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="records/s",
        rows=figure_rows(raw, raw_text, sink, alo, overhead_ms), targets=targets, argv=argv))

    if not args.keep:
        with psycopg.connect(dsn, autocommit=True) as conn:
            stages = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE starts_with(tablename, %s)",
                                                  (f"bench_pgdel_{tag}__eosink_stage_",)).fetchall()]
            for t in set(tables) | set(stages):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(t)))
            for c in [f"bench{tag}r{r}" for r in range(args.rounds)] + [f"bench{tag}d"]:
                for tbl in ("eosink_offsets", "eosink_committed_txns", "eosink_txn_manifest"):
                    conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(sql.Identifier(tbl)), (c,))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
