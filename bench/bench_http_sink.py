"""Benchmark: the HTTP sink's full 2PC cycle against a raw POST of the same body.

Both go to the reference server (``connectors/http/reference_server.py``), started here as a
subprocess with its data directory on local disk (fsync on), with ~200-byte JSON records over
``--partitions`` partitions, ``--batch`` records per cycle (one commit.interval.ms=1000 cycle's worth):

(a) raw POST (the ceiling) - the very body the sink sends, built beforehand, POSTed once per
    cycle to ``/prepare/{txn}`` over a kept-alive connection: the server parses, validates and
    fsyncs it exactly as for the sink. The least a client of this server does per batch.
    (Those txns are aborted between cycles, outside the timing.)
(b) the sink - begin_transaction / write / pre_commit / commit per cycle: building the body
    from the records, the prepare round trip and the commit round trip (the server appends the
    batch to its committed log and fsyncs) all included.

The two modes alternate cycle by cycle, so both see the same load on a shared machine; the best
of ``--rounds`` rounds counts and the median per-cycle ratio is printed too.

    python bench/bench_http_sink.py [--records 400000] [--batch 50000] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import urllib3  # noqa: E402

from bench import report  # noqa: E402
from bench._data import make_records  # noqa: E402
from eosink.connectors.api.records import TxnManifest  # noqa: E402
from eosink.connectors.http.sink import HttpSink, encode_body  # noqa: E402
from eosink.worker.stack.proc import free_port  # noqa: E402


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "eosink.connectors.http.reference_server", "--port", str(port),
                             "--data-dir", str(data_dir)], cwd=REPO, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("the reference server did not start") from None
            time.sleep(0.05)


TITLE = "HTTP sink: full 2PC cycles against a raw POST of the same body"
MEASURES = ("Records/s of the HTTP sink's full cycle (body built from the records, prepare and commit round trips) "
            "into the reference server, against POSTing the very same body once per cycle.")
BASELINE = "a raw POST of the body the sink sends, built beforehand, to the same server, in the same run"


def figure_rows(raw_rate: float, sink_rate: float, overhead_ms: float, cycle_ratio: float) -> list[dict[str, Any]]:
    return [
        report.row("raw POST of the same body (ceiling)", round(raw_rate), baseline=True),
        report.row("eosink HTTP sink, full 2PC cycle", round(sink_rate), raw_rate,
                   note=f"2PC overhead {overhead_ms:.0f} ms per cycle; median per-cycle ratio {cycle_ratio:.0%}"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=50_000, help="records per cycle")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=None, help="server data directory (default: a fresh temp dir)")
    report.add_arguments(ap)
    args = ap.parse_args(argv)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="eosink-http-bench-"))
    tag = uuid.uuid4().hex[:6]
    topic = f"bench.http.{tag}"
    proc, url = start_server(data_dir)
    try:
        t0 = time.perf_counter()
        records = make_records(topic, args.records, args.partitions)
        parts = [records[i:i + args.batch] for i in range(0, len(records), args.batch)]
        avg = statistics.fmean(len(r.raw_value or b"") for r in records[:10_000])
        gc.collect()
        gc.freeze()
        raw_bodies = [encode_body(TxnManifest.covering(f"raw{tag}.w.0.{i}", f"raw{tag}", p, 1), p) for i, p in enumerate(parts)]
        print(f"{len(records):,} records of ~{avg:.0f} bytes JSON, {args.partitions} partitions, {len(parts)} cycles of "
              f"{args.batch:,} ({len(raw_bodies[0]) / 1e6:.1f} MB body per cycle); generated in {time.perf_counter() - t0:.1f}s; "
              f"reference server {url}, data {data_dir}")

        http = urllib3.PoolManager(maxsize=1, retries=False, timeout=urllib3.Timeout(connect=5, read=120))
        headers = {"Content-Type": "application/json"}
        raw_s: list[float] = []
        sink_s: list[float] = []
        cycles: list[dict[str, float]] = []
        ratios: list[float] = []
        for rnd in range(args.rounds):
            connector = f"bench{tag}r{rnd}"
            sink = HttpSink(connector, {"http.url": url, "http.timeout.ms": 120_000})
            sink.open()
            raw_t = sink_t = 0.0
            for i, (part, body) in enumerate(zip(parts, raw_bodies)):
                txn = f"raw{tag}.w.{rnd}.{i}"
                body = encode_body(TxnManifest.covering(txn, f"raw{tag}", part, 1), part)  # a fresh txn id, built untimed
                r0 = time.perf_counter()
                resp = http.request("POST", f"{url}/prepare/{txn}", body=body, headers=headers)
                r = time.perf_counter() - r0
                assert resp.status == 200, resp.data
                http.request("POST", f"{url}/abort/{txn}")  # outside the timing: keep the server's state small
                m = TxnManifest.covering(f"{connector}.w.1.{i + 1}", connector, part, 1)
                c0 = time.perf_counter()
                sink.begin_transaction(m.txn_id)
                sink.write(part)
                sink.pre_commit(m)
                sink.commit(m.txn_id)
                c = time.perf_counter() - c0
                t = sink.timings
                cycles.append({"encode": t.encode_ms, "prepare": t.prepare_ms, "commit": t.commit_ms,
                               "cycle": c * 1000, "raw": r * 1000})
                raw_t, sink_t = raw_t + r, sink_t + c
                ratios.append(r / c)
            sink.close()
            raw_s.append(raw_t)
            sink_s.append(sink_t)
            committed = 0
            with open(data_dir / "committed.jsonl", "rb") as log:
                for line in log:
                    if f'"connector":"{connector}"'.encode() in line[:300]:
                        committed += len(json.loads(line)["records"])
            assert committed == len(records), f"round {rnd}: {committed} records committed, expected {len(records)}"

        n = len(records)
        nbytes = sum(len(b) for b in raw_bodies)
        raw_rate, sink_rate = n / min(raw_s), n / min(sink_s)
        print()
        print(f"{'mode':40s} {'records/s':>11s} {'MB/s':>7s} {'vs ceiling':>11s}   rounds (records/s)")
        for name, secs in (("raw POST of the body (ceiling)", raw_s), ("eosink HttpSink, 2PC cycle", sink_s)):
            rate = n / min(secs)
            print(f"{name:40s} {rate:>11,.0f} {nbytes / min(secs) / 1e6:>7.1f} {rate / raw_rate:>10.0%}   "
                  f"{', '.join(f'{n / s:,.0f}' for s in secs)}")

        def med(k: str) -> float:
            return statistics.median(c[k] for c in cycles)

        print()
        print(f"per cycle of {args.batch:,} records (medians of {len(cycles)}): sink cycle {med('cycle'):.0f} ms = "
              f"body {med('encode'):.0f} ms + prepare POST {med('prepare'):.0f} ms + commit POST {med('commit'):.0f} ms; "
              f"raw POST {med('raw'):.0f} ms")
        print(f"2PC overhead per cycle: {med('cycle') - med('raw'):.0f} ms (sink cycle - raw POST of the same body); "
              f"median per-cycle ratio {statistics.median(ratios):.0%}")
        print(f"target >= 50% of the ceiling: {'met' if sink_rate >= 0.5 * raw_rate else 'MISSED'} "
              f"({sink_rate / raw_rate:.0%} best rounds)")
        conditions = (f"{n:,} records of ~{avg:.0f} bytes JSON, {args.partitions} partitions, {args.batch:,} per cycle "
                      f"({len(raw_bodies[0]) / 1e6:.1f} MB body), modes alternated cycle by cycle, best of {args.rounds} rounds; "
                      f"the reference server on this machine, fsync on; {report.load_note()}")
        report.maybe_publish(args, lambda: report.figure(
            "http", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="records/s",
            rows=figure_rows(raw_rate, sink_rate, med("cycle") - med("raw"), statistics.median(ratios)), argv=argv,
            targets=[report.target("sink vs raw POST (best rounds)", ">= 50%", f"{sink_rate / raw_rate:.0%}",
                                   sink_rate >= 0.5 * raw_rate)]))
    finally:
        proc.kill()
        proc.wait()
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
