"""Benchmark: the Iceberg sink's full 2PC cycle against a raw pyiceberg ``table.append``.

Measured in one run, on the same ~200-byte JSON records (9 value fields + the Kafka coordinates),
each mode into its own fresh table of the same schema, SQL catalog in PostgreSQL:

(a) raw append, prebuilt - ``table.append(arrow_table)`` per batch, the Arrow tables built before
    the clock starts: the ceiling (Parquet write + one snapshot commit, nothing else).
(b) raw append from dicts - ``pa.Table.from_pylist(values)`` + ``table.append`` per batch: what a
    plain at-least-once consumer of the same decoded records would do.
(c) the sink - begin_transaction / write / pre_commit / commit per batch: type checks, Arrow
    conversion, fence, Parquet into the txn's directory (+ fsync on a local disk), the marker,
    and a commit that checks the txn id and appends in one snapshot with the fence state.
(d) the sink with ``iceberg.fsync=false``, to show what durability of "prepared" costs locally.

Record generation is outside every timing. Modes alternate for ``--rounds`` rounds and the best
round of each counts (the machine is shared; every round is printed).

    python bench/bench_iceberg_sink.py [--records 1000000] [--batch 50000] [--warehouse file|s3]

The catalog is the local stack's PostgreSQL (``eosink stack up``); ``--warehouse s3`` puts the
tables on the stack's S3 (moto: a dev server, compare only within the run).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
from pyiceberg.catalog import load_catalog  # noqa: E402
from pyiceberg.io.pyarrow import schema_to_pyarrow  # noqa: E402

from connectors.iceberg import IcebergSink  # noqa: E402
from connectors.records import PartitionRange, SinkRecord, TxnManifest  # noqa: E402

PARTITIONS = 4
STATUSES = ("paid", "pending", "refunded", "failed")
COUNTRIES = ("DE", "FR", "NL", "US", "GB", "PL")
NAMESPACE = "eosink_bench"


def make_records(topic: str, n: int) -> list[SinkRecord]:
    """``n`` records round-robin over the partitions, ~200 bytes of JSON each (as bench_postgres_sink)."""
    out: list[SinkRecord] = []
    for i in range(n):
        value = {
            "id": i,
            "user": f"user_{i % 99991:05d}",
            "email": f"user{i % 99991}@example.com",
            "amount": round((i * 7919 % 100000) / 100.0, 2),
            "currency": "EUR",
            "status": STATUSES[i % 4],
            "country": COUNTRIES[i % 6],
            "created": f"2024-05-{1 + i % 28:02d}T12:{i % 60:02d}:{i * 7 % 60:02d}Z",
            "note": f"order {i} shipped via standard delivery, thank you",
        }
        out.append(SinkRecord(topic, i % PARTITIONS, i // PARTITIONS, None, value, json.dumps(value).encode()))
    return out


def batches(records: Sequence[SinkRecord], size: int) -> list[Sequence[SinkRecord]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


def manifest_for(txn: str, connector: str, batch: Sequence[SinkRecord], epoch: int) -> TxnManifest:
    lo: dict[tuple[str, int], int] = {}
    hi: dict[tuple[str, int], int] = {}
    for r in batch:
        k = (r.topic, r.partition)
        lo[k] = min(lo.get(k, r.offset), r.offset)
        hi[k] = max(hi.get(k, r.offset), r.offset)
    return TxnManifest(txn, connector, tuple(PartitionRange(t, p, lo[(t, p)], hi[(t, p)], epoch) for t, p in sorted(lo)))


@dataclass
class Result:
    name: str
    records: int = 0
    seconds: float = 0.0
    rounds: list[float] = field(default_factory=list)  # records/s per round
    cpu: float = 0.0  # process CPU seconds of the best round (all threads; not the catalog's or S3's)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def add(self, n: int, fn: Callable[[], float]) -> None:
        c0 = time.process_time()
        secs = fn()
        cpu = time.process_time() - c0
        self.rounds.append(n / secs)
        if not self.seconds or secs < self.seconds:
            self.records, self.seconds, self.cpu = n, secs, cpu


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from worker.stack import load_endpoints

        ep = load_endpoints()
        self.tag = uuid.uuid4().hex[:6]
        self.tmp = Path(tempfile.mkdtemp(prefix="eosink-bench-iceberg-"))
        scheme, rest = ep.postgres_dsn.split("://", 1)
        self.config: dict[str, Any] = {"iceberg.catalog.uri": f"postgresql+psycopg2://{rest}", "iceberg.catalog.name": "eosink_bench"}
        if args.warehouse == "s3":
            import boto3

            client = boto3.client("s3", **ep.s3)
            try:
                client.create_bucket(Bucket="eosink-bench")
            except client.exceptions.BucketAlreadyOwnedByYou:
                pass
            self.config |= {"iceberg.warehouse": f"s3://eosink-bench/{self.tag}", "s3.endpoint": ep.s3["endpoint_url"],
                            "s3.access-key-id": ep.s3["aws_access_key_id"], "s3.secret-access-key": ep.s3["aws_secret_access_key"],
                            "s3.region": ep.s3["region_name"]}
        else:
            self.config["iceberg.warehouse"] = f"file://{self.tmp}/warehouse"
        props = {k: v for k, v in self.config.items() if k.startswith("s3.")}
        self.catalog = load_catalog("eosink_bench", type="sql", uri=self.config["iceberg.catalog.uri"],
                                    warehouse=self.config["iceberg.warehouse"], **props)
        self.tables: list[str] = []

    def sink(self, table: str, **extra: Any) -> IcebergSink:
        s = IcebergSink(f"bench{self.tag}", {**self.config, "iceberg.table": f"{NAMESPACE}.{table}", **extra})
        s.open()
        self.tables.append(f"{NAMESPACE}.{table}")
        return s

    def schema(self, topic: str) -> Any:
        """The schema the sink auto-creates for these records (a 1-record warm-up, aborted)."""
        s = self.sink(f"schema_{self.tag}")
        warm = make_records(topic, 1)
        s.begin_transaction("warm")
        s.write(warm)
        s.pre_commit(manifest_for("warm", s.connector, warm, 1))
        s.abort("warm")
        return self.catalog.load_table(f"{NAMESPACE}.schema_{self.tag}").schema()

    def raw_table(self, name: str, schema: Any) -> Any:
        ident = f"{NAMESPACE}.{name}"
        self.tables.append(ident)
        return self.catalog.create_table(ident, schema=schema, properties={"commit.retry.num-retries": "0"})

    def run_raw(self, name: str, schema: Any, parts: list[Sequence[SinkRecord]], prebuilt: bool) -> float:
        table = self.raw_table(name, schema)
        arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)

        def build(part: Sequence[SinkRecord]) -> pa.Table:
            return pa.Table.from_pylist([{**r.value, "__topic": r.topic, "__partition": r.partition, "__offset": r.offset} for r in part],
                                        schema=arrow_schema)

        ready = [build(p) for p in parts] if prebuilt else None
        t0 = time.perf_counter()
        for i, part in enumerate(parts):
            table.append(ready[i] if ready is not None else build(part))
        elapsed = time.perf_counter() - t0
        assert self.catalog.load_table(f"{NAMESPACE}.{name}").scan().count() == sum(map(len, parts)), "raw append lost rows"
        return elapsed

    def run_sink(self, name: str, parts: list[Sequence[SinkRecord]], cycles: list[dict[str, float]], **extra: Any) -> float:
        s = self.sink(name, **extra)
        warm = make_records(parts[0][0].topic, 1)  # auto.create outside the timing, as in a long-running worker
        s.begin_transaction(f"{s.connector}.w.0.0")
        s.write(warm)
        s.pre_commit(manifest_for(f"{s.connector}.w.0.0", s.connector, warm, 1))
        s.abort(f"{s.connector}.w.0.0")
        manifests = [manifest_for(f"{s.connector}.w.1.{i + 1}", s.connector, part, 1) for i, part in enumerate(parts)]
        t0 = time.perf_counter()
        for part, m in zip(parts, manifests):
            c0 = time.perf_counter()
            s.begin_transaction(m.txn_id)
            s.write(part)
            s.pre_commit(m)
            c1 = time.perf_counter()
            s.commit(m.txn_id)
            c2 = time.perf_counter()
            t = s.timings
            cycles.append({"prepare": (c1 - c0) * 1000, "commit": (c2 - c1) * 1000, "load": t.load_ms, "convert": t.convert_ms,
                           "write": t.write_ms, "marker": t.marker_ms})
        elapsed = time.perf_counter() - t0
        assert self.catalog.load_table(f"{NAMESPACE}.{name}").scan().count() == sum(map(len, parts)), "sink lost rows"
        s.close()
        return elapsed

    def cleanup(self) -> None:
        for ident in set(self.tables):
            try:
                self.catalog.purge_table(ident)
            except Exception:  # noqa: BLE001 - best effort
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=50_000, help="records per cycle")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of every mode")
    ap.add_argument("--warehouse", choices=("file", "s3"), default="file")
    ap.add_argument("--keep", action="store_true", help="keep the tables and files")
    args = ap.parse_args(argv)

    bench = Bench(args)
    topic = f"bench.iceberg.{bench.tag}"
    t0 = time.perf_counter()
    records = make_records(topic, args.records)
    avg_bytes = statistics.fmean(len(r.raw_value or b"") for r in records[:10_000])
    parts = batches(records, args.batch)
    # A worker holds one cycle's batch; this process holds all of them: keep full GC walks out.
    gc.collect()
    gc.freeze()
    print(f"{len(records):,} records of ~{avg_bytes:.0f} bytes JSON in {len(parts)} batches of {args.batch:,}; generated in "
          f"{time.perf_counter() - t0:.1f}s; SQL catalog in PostgreSQL, warehouse {bench.config['iceberg.warehouse']}")

    schema = bench.schema(topic)
    raw = Result("raw append, prebuilt Arrow (ceiling)")
    raw_dicts = Result("raw from_pylist + append")
    sink = Result("eosink IcebergSink, 2PC cycle")
    sink_nosync = Result("IcebergSink, iceberg.fsync=false")
    cycles: list[dict[str, float]] = []
    nosync_cycles: list[dict[str, float]] = []
    try:
        for rnd in range(args.rounds):
            runs: list[tuple[Result, Callable[[], float]]] = [
                (raw, lambda: bench.run_raw(f"raw_{bench.tag}_{rnd}", schema, parts, True)),
                (raw_dicts, lambda: bench.run_raw(f"rawd_{bench.tag}_{rnd}", schema, parts, False)),
                (sink, lambda: bench.run_sink(f"sink_{bench.tag}_{rnd}", parts, cycles)),
            ]
            if args.warehouse == "file":
                runs.append((sink_nosync, lambda: bench.run_sink(f"sinkn_{bench.tag}_{rnd}", parts, nosync_cycles,
                                                                 **{"iceberg.fsync": False})))
            for res, fn in runs:
                res.add(len(records), fn)
    finally:
        if not args.keep:
            bench.cleanup()

    results = [raw, raw_dicts, sink] + ([sink_nosync] if sink_nosync.rounds else [])
    print()
    print(f"{'mode':38s} {'records':>10s} {'seconds':>8s} {'cpu s':>6s} {'records/s':>11s} {'vs ceiling':>11s}   rounds (records/s)")
    for res in results:
        print(f"{res.name:38s} {res.records:>10,} {res.seconds:>8.2f} {res.cpu:>6.2f} {res.rate:>11,.0f} {res.rate / raw.rate:>10.0%}   "
              f"{', '.join(f'{x:,.0f}' for x in res.rounds)}")

    def med(rows: list[dict[str, float]], k: str) -> float:
        return statistics.median(c[k] for c in rows)

    n_cycles = len(parts)
    raw_cycle_ms = raw.seconds / n_cycles * 1000
    for label, rows, res in (("fsync on", cycles, sink), ("fsync off", nosync_cycles, sink_nosync)):
        if not rows:
            continue
        print()
        print(f"sink cycle of {args.batch:,} records, {label} (median of {len(rows)}): prepare {med(rows, 'prepare'):.1f} ms "
              f"[table load + fence {med(rows, 'load'):.1f}, checks + Arrow {med(rows, 'convert'):.1f}, Parquet write "
              f"{med(rows, 'write'):.1f}, marker {med(rows, 'marker'):.1f}], commit {med(rows, 'commit'):.1f} ms")
        print(f"  2PC overhead per cycle: marker + table load/fence + commit = "
              f"{med(rows, 'marker') + med(rows, 'load') + med(rows, 'commit'):.1f} ms (median); best-round cycle "
              f"{res.seconds / n_cycles * 1000:.1f} ms vs raw append {raw_cycle_ms:.1f} ms "
              f"(+{res.seconds / n_cycles * 1000 - raw_cycle_ms:.1f} ms)")
    print()
    targets = [(">= 50% of the raw append ceiling", sink.rate >= 0.5 * raw.rate)]
    print("targets: " + "; ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in targets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
