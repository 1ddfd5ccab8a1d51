"""``bench_e2e.py --audit-overhead SECONDS[:MAX_RECORDS]``: what the continuous audit costs end to end.

The same end-to-end run (:func:`bench.bench_e2e.run_e2e`: a fresh worker process, a postgres
connector registered through the REST API, the clock from the POST to the last row) is repeated
``--pairs`` times without and with each ``--audit-overhead SECONDS[:MAX_RECORDS]`` given (the
worker's ``--audit-interval`` and ``--audit-max-records``), alternated (off, on, off, on, ...) so
that the shared machine's drift falls on all alike. The ratio of the
median rates is the continuous audit's cost; each audited run also says how many audit rounds the
worker logged and how many records they checked (a run too short for a round measures nothing).
Target: the audit costs at most 5% of the end-to-end rate.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from bench import report as published

TARGET_COST = 0.05
TITLE = "End to end with the continuous audit on: Kafka to PostgreSQL through one worker process"
MEASURES = ("Records/s of the end-to-end run (POST of a postgres connector to the last row visible, one worker process), "
            "with the worker's continuous audit (--audit-interval) on, against the same run with it off, alternated.")
BASELINE = "the same end-to-end run, the audit off, alternated with the audited runs"


def audit_rounds(log_path: Path) -> tuple[int, int, float]:
    """Rounds that audited something, the records they checked, and the seconds they took."""
    from bench.bench_e2e import log_events

    rounds = [e for e in log_events(log_path) if e.get("event") == "audit_round"]
    return len(rounds), sum(int(e.get("records") or 0) for e in rounds), sum(float(e.get("seconds") or 0) for e in rounds)


def parse(spec: str) -> tuple[float, int | None]:
    """``SECONDS[:MAX_RECORDS]``: the worker's ``--audit-interval`` and ``--audit-max-records``."""
    interval, _, cap = spec.partition(":")
    return float(interval), int(cap) if cap else None


def label(interval: float, cap: int | None) -> str:
    return f"--audit-interval {interval:g}" + (f" --audit-max-records {cap:,}" if cap else "")


def run_overhead(args: argparse.Namespace, ep: Any, topic: str, tag: str, logdir: Path) -> dict[str, Any]:
    from bench.bench_e2e import run_e2e

    configs = [parse(s) for s in args.audit_overhead]
    off: list[dict[str, Any]] = []
    on: list[list[dict[str, Any]]] = [[] for _ in configs]
    for i in range(args.pairs):
        for k, cfg in [(-1, None), *enumerate(configs)]:
            args.worker_args = [] if cfg is None else ["--audit-interval", f"{cfg[0]:g}"] + (
                ["--audit-max-records", str(cfg[1])] if cfg[1] else [])
            r = run_e2e(args, ep, topic, f"{tag}{i}{'p' if cfg is None else k}", logdir)
            if cfg is not None:
                r["audit_rounds"], r["audited_records"], r["audit_s"] = audit_rounds(Path(r["log"]))
            (off if cfg is None else on[k]).append(r)
            print(f"  {'audit off' if cfg is None else label(*cfg)} run {i + 1}: {r['rate']:,.0f} records/s in "
                  f"{r['seconds']:.2f}s" + (f"; {r['audit_rounds']} audit rounds checked {r['audited_records']:,} records "
                                            f"in {r['audit_s']:.2f}s" if cfg is not None else "")
                  + f" (check {'ok' if r['check']['ok'] else 'FAILED'})", flush=True)
    base = statistics.median(r["rate"] for r in off)
    out: dict[str, Any] = {"off": off, "median_off": base, "configs": [], "ok": all(r["check"]["ok"] for r in off)}
    for cfg, runs in zip(configs, on):
        rate = statistics.median(r["rate"] for r in runs)
        cost = 1 - rate / base
        out["configs"].append({"interval_s": cfg[0], "max_records": cfg[1], "runs": runs, "median": rate, "cost": cost})
        out["ok"] = out["ok"] and all(r["check"]["ok"] for r in runs)
        print(f"{label(*cfg)}: {rate:,.0f} vs {base:,.0f} records/s without = {cost:+.1%} cost "
              f"(target <= {TARGET_COST:.0%}: {'met' if cost <= TARGET_COST else 'MISSED'})")
    return out


def figure(args: argparse.Namespace, result: dict[str, Any], argv: Any) -> dict[str, Any]:
    off, base, n = result["off"], result["median_off"], args.records

    def span(rs: list[dict[str, Any]]) -> str:
        return f"median of {len(rs)} runs ({min(r['rate'] for r in rs):,.0f}-{max(r['rate'] for r in rs):,.0f})"

    def cpu(rs: list[dict[str, Any]]) -> float:
        return statistics.median(r["cpu_s"] / n * 1e6 for r in rs)

    rows = [published.row("audit off", round(base), baseline=True, cpu_us=cpu(off), note=span(off))]
    for c in result["configs"]:
        rs = c["runs"]
        rounds, audited = [r["audit_rounds"] for r in rs], [r["audited_records"] for r in rs]
        rows.append(published.row(label(c["interval_s"], c["max_records"]), round(c["median"]), base, cpu_us=cpu(rs),
                                  note=f"{span(rs)}; {min(rounds)}-{max(rounds)} rounds a run checked "
                                       f"{min(audited):,}-{max(audited):,} records"))
    first = result["configs"][0]
    conditions = (f"{n:,} JSON records in {args.partitions} partitions, one worker process (the cluster's leader, so it "
                  f"audits), commit.interval.ms {args.commit_interval_ms}, {len(off)} runs of each kind, alternated; "
                  f"{published.load_note()} at the end (the machine is shared)")
    return published.figure(
        "e2e-audit", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="records/s", rows=rows,
        targets=[published.target(f"cost of {label(first['interval_s'], first['max_records'])}", f"<= {TARGET_COST:.0%}",
                                  f"{first['cost']:.1%}", first["cost"] <= TARGET_COST)],
        argv=argv, make_target="bench-e2e")


__all__ = ["audit_rounds", "figure", "run_overhead"]
