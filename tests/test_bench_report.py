"""The benchmark figures the docs show: each chart and table matches the JSON it was rendered from.

No server: these read and write files only. The docs include ``docs/benchmarks/<name>.table`` and
show ``<name>.svg``; both are rendered from ``bench/figures/<name>.json``, and an edit of the JSON
that is not rendered again must fail here, naming the file that went stale.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench._chart import bar_lengths, digest_of
from bench._table import table

REPO = Path(__file__).resolve().parent.parent
#: One figure per bench script (bench/bench_*.py but the transforms' micro-benchmark).
BENCHMARKS = {"worker", "e2e", "e2e-audit", "audit", "postgres", "s3", "http", "iceberg", "spark", "spark-streaming", "cluster",
              "connectors", "stream-latency", "peers"}


def small_figure() -> dict[str, Any]:
    base = 1000.0
    return report.figure(
        "toy", title="A toy sink against a raw write", measures="Records/s of a toy sink.", baseline="a raw write",
        conditions="3 records, idle machine", unit="records/s", argv=["--records", "3", "--publish", "--publish-dir", "/x"],
        rows=[report.row("raw write | ceiling", base, baseline=True, cpu_us=1.5),
              report.row("toy sink", 750.0, base, cpu_us=2.25, note="2PC"),
              report.row("not recorded here", None, base, note="no single figure")],
        targets=[report.target("toy sink >= 70% of the raw write", ">= 70%", "75%", True),
                 report.target("toy sink >= the raw write", ">= 100%", "75%", False)])


def test_publish_writes_the_json_then_a_table_and_a_chart_drawn_from_it(tmp_path: Path) -> None:
    fig = small_figure()
    assert fig["command"] == "make bench-toy BENCH_ARGS='--records 3'"
    assert [r["ratio"] for r in fig["rows"]] == [1.0, 0.75, None]

    written = report.publish(fig, tmp_path)

    json_path, table_path, svg_path = report.paths(tmp_path, "toy")
    assert written == [json_path, table_path, svg_path]
    assert json.loads(json_path.read_text(encoding="utf-8")) == fig
    assert digest_of(svg_path.read_text(encoding="utf-8")) == report.digest(fig)
    text = table_path.read_text(encoding="utf-8")
    assert text == table(fig)
    assert "| **raw write \\| ceiling** | 1,000 | baseline | 1.5 |" in text
    assert "| toy sink | 750 | 0.75x | 2.25 | 2PC |" in text
    assert "| toy sink >= the raw write | >= 100% | 75% | **missed** |" in text
    assert report.check(tmp_path) == []


def test_the_chart_is_the_same_bytes_for_the_same_figures(tmp_path: Path) -> None:
    report.publish(small_figure(), tmp_path)
    svg = report.paths(tmp_path, "toy")[2]
    first = svg.read_bytes()
    report.render(tmp_path)
    assert svg.read_bytes() == first


def test_rows_recorded_as_ratios_only_are_drawn_by_their_ratios() -> None:
    rows = [report.row("ceiling", None, baseline=True), {**report.row("sink", None), "ratio": 0.59}]
    assert bar_lengths(rows) == ([1.0, 0.59], True)
    assert bar_lengths(small_figure()["rows"]) == ([1000.0, 750.0, 0.0], False)


def test_a_malformed_figure_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    fig = small_figure()
    fig["rows"][1]["value"] = "750"
    del fig["unit"]
    with pytest.raises(ValueError, match=r"unit: missing.*rows\[1\]\.value: str where int or float or null"):
        report.publish(fig, tmp_path)
    assert not any(tmp_path.iterdir())


def test_the_committed_figures_match_their_tables_and_charts() -> None:
    assert report.check(REPO) == []
    assert {p.stem for p in (REPO / report.FIGURES).glob("*.json")} >= BENCHMARKS


def test_a_figure_edited_without_rendering_again_fails_the_check_naming_its_files(tmp_path: Path) -> None:
    for sub in (report.FIGURES, report.DOCS):
        shutil.copytree(REPO / sub, tmp_path / sub)
    path = tmp_path / report.FIGURES / "worker.json"
    fig = json.loads(path.read_text(encoding="utf-8"))
    fig["rows"][0]["value"] += 1
    path.write_text(json.dumps(fig, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    found = report.check(tmp_path)

    assert [line.split(":")[0] for line in found] == ["docs/benchmarks/worker.table", "docs/benchmarks/worker.svg"]
    report.render_one(path, tmp_path)
    assert report.check(tmp_path) == []


def test_a_table_or_chart_without_its_figure_is_named(tmp_path: Path) -> None:
    report.publish(small_figure(), tmp_path)
    report.paths(tmp_path, "toy")[0].unlink()
    assert report.check(tmp_path) == ["docs/benchmarks/toy.svg: no figure bench/figures/toy.json",
                                      "docs/benchmarks/toy.table: no figure bench/figures/toy.json"]
