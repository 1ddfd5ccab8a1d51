"""A benchmark's figures as the Markdown fragment the docs include (``pymdownx.snippets``).

Plain Markdown only, no front matter and no heading: the page that includes it says what the
benchmark is; the fragment holds what changes with every published run (the figures, the
targets, the date and conditions), so the page never shows figures older than its chart.
"""

from __future__ import annotations

from typing import Any


def number(value: float | None) -> str:
    """A figure as a reader scans it: thousands separated, small values to three digits."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def ratio(value: float | None, baseline: bool = False) -> str:
    if baseline:
        return "baseline"
    return "-" if value is None else f"{value:.2f}x"


def cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}".rstrip("0").rstrip(".")


def cell(text: str) -> str:
    """Text safe in a table cell: a ``|`` would end the cell, a newline the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(fig: dict[str, Any]) -> str:
    """The rows table, a line of when and how they were measured, and the targets table if any."""
    lines = [f"| | {cell(fig['unit'])} | vs baseline | CPU µs/record | note |", "|---|---:|---:|---:|---|"]
    for r in fig["rows"]:
        label = f"**{cell(r['label'])}**" if r["baseline"] else cell(r["label"])
        lines.append(f"| {label} | {number(r['value'])} | {ratio(r['ratio'], r['baseline'])} | "
                     f"{cpu(r['cpu_us_per_record'])} | {cell(r['note'])} |")
    lines += ["", f"*Measured {fig['measured']}: {cell(fig['conditions']).rstrip('.')}. Reproduce with `{fig['command']}`.*"]
    if fig["targets"]:
        lines += ["", "| what | target | result | met |", "|---|---|---|---|"]
        for t in fig["targets"]:
            lines.append(f"| {cell(t['what'])} | {cell(t['target'])} | {cell(t['result'])} | "
                         f"{'met' if t['met'] else '**missed**'} |")
    return "\n".join(lines) + "\n"
