"""A benchmark's figures as the SVG bar chart the docs show.

The chart is written by the bench scripts themselves, so it has to be deterministic: the same
figures give the same bytes (fixed ``svg.hashsalt``, no date in the metadata), or every run of
``report.py render`` would rewrite every chart. It carries the SHA-256 of the figures it was drawn
from in its Description metadata: ``report.py check`` compares that, not the drawing, so a
matplotlib upgrade that moves a pixel does not fail the check, while an edited figure does.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

from bench._table import number

#: How the digest sits in the SVG: matplotlib writes the Description metadata as <dc:description>.
DIGEST = re.compile(r"<dc:description>sha256:([0-9a-f]{64})</dc:description>")
BAR = "#3b6ea5"
BASELINE = "#b8b8b8"


def digest_of(svg_text: str) -> str | None:
    """The SHA-256 of the figures a chart was drawn from, or None if it carries none."""
    m = DIGEST.search(svg_text)
    return m.group(1) if m else None


def bar_label(row: dict[str, Any], by_ratio: bool) -> str:
    """What is written at the end of a bar: the value (its unit is the axis's), and its ratio to the baseline."""
    if by_ratio:
        return "baseline" if row["baseline"] else f"{row['ratio']:.2f}x" if row["ratio"] is not None else "not recorded"
    value = number(row["value"]) if row["value"] is not None else "not recorded"
    if row["baseline"]:
        return f"{value} (baseline)"
    return f"{value} ({row['ratio']:.2f}x)" if row["ratio"] is not None else value


def bar_lengths(rows: list[dict[str, Any]]) -> tuple[list[float], bool]:
    """Each row's value; or, where a run recorded ratios but no single value for any row (figures
    over many runs that moved with the machine's load), each row's ratio to the baseline."""
    if all(r["value"] is None for r in rows) and any(r["ratio"] is not None for r in rows):
        return [1.0 if r["baseline"] else r["ratio"] or 0.0 for r in rows], True
    return [r["value"] or 0.0 for r in rows], False


def write_svg(fig: dict[str, Any], digest: str, path: Path) -> None:
    """Horizontal bars of each row's value (see :func:`bar_lengths`), top to bottom in the figures'
    order, the baseline grey and hatched; rows without a value keep their place and say so."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = fig["rows"]
    labels = [textwrap.fill(r["label"], 40, break_on_hyphens=False) for r in rows]
    height = 1.1 + sum(0.22 + 0.16 * label.count("\n") for label in labels) + 0.2 * len(rows)
    with matplotlib.rc_context({
        "svg.hashsalt": "eosink-bench",  # ids from a fixed salt: identical figures, identical bytes
        "svg.fonttype": "none",  # text as text: small files, and the labels stay searchable
        "font.family": "sans-serif",
        "font.size": 9,
    }):
        chart = Figure(figsize=(8.0, max(2.0, height)))
        ax = chart.add_subplot()
        y = list(range(len(rows)))
        values, by_ratio = bar_lengths(rows)
        bars = ax.barh(y, values, height=0.62, color=[BASELINE if r["baseline"] else BAR for r in rows],
                       edgecolor=["#707070" if r["baseline"] else BAR for r in rows], linewidth=0.6)
        for bar, r in zip(bars, rows):
            if r["baseline"]:
                bar.set_hatch("///")
        top = max(values) if any(values) else 1.0
        for i, r in enumerate(rows):
            ax.text(values[i] + top * 0.01, i, bar_label(r, by_ratio), va="center", fontsize=8)
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlim(0, top * 1.4)
        unit = "ratio to the baseline (no single rates recorded)" if by_ratio else fig["unit"]
        ax.set_xlabel(f"{unit} (measured {fig['measured']})")
        chart.suptitle(textwrap.fill(fig["title"], 100, break_on_hyphens=False), x=0.01, ha="left", fontsize=10)
        ax.spines[["top", "right"]].set_visible(False)
        ax.xaxis.set_major_formatter(lambda v, _pos: number(v))
        chart.tight_layout()
        chart.savefig(path, format="svg", metadata={"Date": None, "Description": f"sha256:{digest}"})
