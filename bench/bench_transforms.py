"""Benchmark: what a two-transform chain costs per record, against a plain loop over the same records.

The records are the ~200-byte JSON orders every benchmark uses (``bench/_data.py``), decoded to
dicts as the worker hands them to a sink. Three loops over the same list, each appending its
output to a list (what the engine does when it builds a batch for ``sink.write``):

1. plain   - the records as they are: the floor of a per-record Python loop.
2. minimal - the same work as the chain, written inline by hand (copy the dict with one more
             field, drop one, write its JSON natively, build a new SinkRecord): the least Python
             can do for it.
3. chain   - ``build_chain`` of ``InsertField$Value`` (static.field) and ``ReplaceField$Value``
             (exclude), one ``chain.apply(record)`` call per record. Like the minimal loop it
             writes each new value's JSON (``raw_value``), which a JSON sink then copies.
4. owned   - the same chain as the engine runs it on a freshly decoded batch
             (``chain.runner(owned=True)``): the values are edited in place and the records
             updated, nothing copied. It runs on a fresh copy of the records each round (not timed).

Each loop runs ``--rounds`` times and the fastest round counts (the machine is shared); CPU time
of the process is reported next to wall time. The chain's output is checked against the minimal
loop's before anything is timed. Results also go to ``bench/results/transforms.json``.

    python bench/bench_transforms.py [--records 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._data import make_records  # noqa: E402
from eosink.connectors.api.records import SinkRecord  # noqa: E402
from eosink.connectors.common.jsoncodec import encode_json_value  # noqa: E402
from eosink.worker.transforms import build_chain  # noqa: E402

CONFIG = {
    "transforms": "source,slim",
    "transforms.source.type": "org.apache.kafka.connect.transforms.InsertField$Value",
    "transforms.source.static.field": "source",
    "transforms.source.static.value": "eosink",
    "transforms.slim.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
    "transforms.slim.exclude": "note",
}


def plain(records: Sequence[SinkRecord]) -> list[SinkRecord]:
    out: list[SinkRecord] = []
    append = out.append
    for r in records:
        append(r)
    return out


def minimal(records: Sequence[SinkRecord]) -> list[SinkRecord]:
    out: list[SinkRecord] = []
    append = out.append
    for r in records:
        v = r.value.copy()
        v["source"] = "eosink"
        v.pop("note", None)
        append(SinkRecord(r.topic, r.partition, r.offset, r.key, v, encode_json_value(v), r.headers, r.timestamp_ms))
    return out


def chained(records: Sequence[SinkRecord]) -> list[SinkRecord]:
    apply = build_chain(CONFIG).apply
    out: list[SinkRecord] = []
    append = out.append
    for r in records:
        t = apply(r)
        if t is not None:
            append(t)
    return out


def owned(records: Sequence[SinkRecord]) -> list[SinkRecord]:
    run = build_chain(CONFIG).runner(owned=True)
    out: list[SinkRecord] = []
    append = out.append
    for r in records:
        t = run(r)
        if t is not None:
            append(t)
    return out


def fresh_copies(records: Sequence[SinkRecord]) -> list[SinkRecord]:
    """Records nobody else holds, values included, as the engine's source decodes them."""
    return [SinkRecord(r.topic, r.partition, r.offset, r.key, r.value.copy(), r.raw_value, r.headers, r.timestamp_ms)
            for r in records]


def timed(fn: Callable[[Sequence[SinkRecord]], list[SinkRecord]], records: Sequence[SinkRecord],
          rounds: int) -> dict[str, float]:
    best_wall = best_cpu = float("inf")
    for _ in range(rounds):
        given = fresh_copies(records) if fn is owned else records
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn(given)
        w1, c1 = time.perf_counter(), time.process_time()
        assert len(out) == len(records)
        del out
        best_wall, best_cpu = min(best_wall, w1 - w0), min(best_cpu, c1 - c0)
    return {"wall_s": best_wall, "cpu_s": best_cpu, "ns_per_record": best_cpu / len(records) * 1e9}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    records = make_records("orders", args.records, 4)
    size = sum(len(r.raw_value or b"") for r in records) / len(records)
    sample = records[: min(1000, len(records))]
    expected = [(r.value, r.raw_value) for r in minimal(sample)]
    assert [(r.value, r.raw_value) for r in chained(sample)] == expected
    assert [(r.value, r.raw_value) for r in owned(fresh_copies(sample))] == expected

    results = {name: timed(fn, records, args.rounds) for name, fn in
               (("plain", plain), ("minimal", minimal), ("chain", chained), ("owned", owned))}
    ratio = results["chain"]["cpu_s"] / results["plain"]["cpu_s"]
    over_minimal = results["chain"]["cpu_s"] / results["minimal"]["cpu_s"]
    print(f"{args.records:,} records of ~{size:.0f} bytes, best of {args.rounds} (Python {platform.python_version()})")
    for name, r in results.items():
        print(f"  {name:8s} wall {r['wall_s']:7.3f} s   cpu {r['cpu_s']:7.3f} s   {r['ns_per_record']:7.0f} ns/record")
    print(f"  chain / plain loop (cpu): {ratio:.1f}x; chain / hand-written minimum (cpu): {over_minimal:.2f}x; "
          f"chain cost: {(results['chain']['cpu_s'] - results['plain']['cpu_s']) / args.records * 1e9:.0f} ns/record; "
          f"owned (as the engine runs it): {(results['owned']['cpu_s'] - results['plain']['cpu_s']) / args.records * 1e9:.0f}"
          " ns/record")
    out = REPO / "bench" / "results" / "transforms.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"records": args.records, "value_bytes": size, "config": CONFIG, "results": results,
                               "chain_over_plain": ratio, "chain_over_minimal": over_minimal}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
