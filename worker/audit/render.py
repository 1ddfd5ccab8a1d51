"""The audit report as an operator reads it: one line per sink, then each partition that is not clean
with its culprits (offset ranges and example ids), then what was not audited and why."""

from __future__ import annotations

from typing import Any

from eosink.worker.audit.tally import FAULTS


def _counts(d: dict[str, Any]) -> str:
    return (f"expected {d['expected']}, once {d['found_once']}, missing {d['missing']}, duplicated {d['duplicated']}, "
            f"foreign {d['foreign']}, stale {d['stale']}, in flight {d['in_flight']}")


def lines(report: dict[str, Any]) -> list[str]:
    src = report.get("source", {})
    out = [f"audit of {report['connector']}: {'CLEAN' if report['ok'] else 'NOT CLEAN'} "
           f"({src.get('records', 0)} committed records due in {src.get('partitions', 0)} partitions, "
           f"{report.get('seconds', 0)} s)"]
    out += [f"  note: {n}" for n in report.get("notes", [])]
    for s in report["sinks"]:
        if s.get("error"):
            out.append(f"  {s['sink']}: COULD NOT BE READ: {s['error']}")
            continue
        if not s["audited"]:
            out.append(f"  {s['sink']}: NOT AUDITED: {s['limit']}")
            continue
        out.append(f"  {s['sink']}: {'clean' if s['clean'] else 'NOT CLEAN'}: {_counts(s['totals'])}")
        for p in s["partitions"]:
            if not any(p[k] for k in FAULTS):
                continue
            out.append(f"    {p['topic']}-{p['partition']} [{p['first']}, {p['due']}): {_counts(p)}")
            for kind, c in p["culprits"].items():
                more = f" (+{c['more_ranges']} more ranges)" if c.get("more_ranges") else ""
                ids = f"; e.g. ids {', '.join(c['ids'])}" if c.get("ids") else ""
                out.append(f"      {kind}: offsets {', '.join(c['ranges'])}{more}{ids}")
    return out
