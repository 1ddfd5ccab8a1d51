"""The published benchmark figures: one JSON per benchmark, and the table and chart the docs
show, rendered from it.

The docs' Benchmarks page shows current figures only, so the figures, their table and their chart
must never drift apart. ``bench/figures/<name>.json`` is the one source: a bench script run with
``--publish`` writes it from that run's results and renders ``docs/benchmarks/<name>.table`` (a
Markdown fragment the page includes) and ``docs/benchmarks/<name>.svg`` from it. Without
``--publish`` nothing is written, so an exploratory run never replaces the published figures.

    python bench/report.py render [--root DIR]   # every table and chart again, from the JSON
    python bench/report.py check [--root DIR]    # non-zero, naming each table or chart that does not match its JSON

A figure::

    {"name", "title", "measures", "baseline", "command", "measured", "conditions", "unit",
     "rows": [{"label", "value", "ratio", "cpu_us_per_record", "baseline", "note"}],
     "targets": [{"what", "target", "result", "met"}]}

``value`` is in ``unit``; ``ratio`` is ``value`` over the baseline row's (null where it has none);
a row's ``value`` is null only where the run recorded no single figure for it (the note says why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._table import table  # noqa: E402

FIGURES = Path("bench/figures")
DOCS = Path("docs/benchmarks")
FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str, "title": str, "measures": str, "baseline": str, "command": str, "measured": str,
    "conditions": str, "unit": str, "rows": list, "targets": list,
}
NUMBER = (int, float)
ROW_FIELDS: dict[str, type | tuple[type, ...]] = {
    "label": str, "value": (*NUMBER, type(None)), "ratio": (*NUMBER, type(None)),
    "cpu_us_per_record": (*NUMBER, type(None)), "baseline": bool, "note": str,
}
TARGET_FIELDS: dict[str, type | tuple[type, ...]] = {"what": str, "target": str, "result": str, "met": bool}


# ---------------------------------------------------------------------------------------- building
def row(label: str, value: float | None, base: float | None = None, *, cpu_us: float | None = None,
        baseline: bool = False, note: str = "") -> dict[str, Any]:
    """One bar: ``value`` in the figure's unit and its ratio to ``base`` (the baseline row's value)."""
    ratio = 1.0 if baseline and value is not None else (round(value / base, 3) if value is not None and base else None)
    return {"label": label, "value": value, "ratio": ratio,
            "cpu_us_per_record": None if cpu_us is None else round(cpu_us, 2), "baseline": baseline, "note": note}


def target(what: str, goal: str, result: str, met: bool) -> dict[str, Any]:
    return {"what": what, "target": goal, "result": result, "met": bool(met)}


def command(make_target: str, argv: Sequence[str]) -> str:
    """How to reproduce a run: its make target, with the arguments it was given (not the publishing ones)."""
    args: list[str] = []
    skip = False
    for a in argv:
        if skip or a == "--publish" or a.startswith("--publish-dir="):
            skip = False
            continue
        if a == "--publish-dir":
            skip = True
            continue
        args.append(a)
    return f"make {make_target}" + (f" BENCH_ARGS={shlex.quote(shlex.join(args))}" if args else "")


def figure(name: str, *, title: str, measures: str, baseline: str, conditions: str, unit: str,
           rows: list[dict[str, Any]], targets: list[dict[str, Any]], argv: Sequence[str] | None = None,
           make_target: str | None = None) -> dict[str, Any]:
    """A figure of a run that just finished: measured today, reproduced by ``make bench-<name>``."""
    return {"name": name, "title": title, "measures": measures, "baseline": baseline,
            "command": command(make_target or f"bench-{name}", sys.argv[1:] if argv is None else argv),
            "measured": time.strftime("%Y-%m-%d", time.gmtime()), "conditions": conditions, "unit": unit,
            "rows": rows, "targets": targets}


def load_note() -> str:
    """The machine's load while a benchmark ran, for its conditions line (the machine is shared)."""
    return f"1-min load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--publish`` and ``--publish-dir``, the same for every bench script."""
    ap.add_argument("--publish", action="store_true",
                    help="write this run's figures, table and chart (bench/figures, docs/benchmarks); off by default, "
                         "so an exploratory run never replaces the published figures")
    ap.add_argument("--publish-dir", type=Path, default=REPO, metavar="DIR",
                    help="the root to publish under (default: the repository; a temp dir to try it)")


def maybe_publish(args: argparse.Namespace, build: Callable[[], dict[str, Any]]) -> None:
    """Publish ``build()`` if ``--publish`` was given; ``build`` is called only then."""
    if args.publish:
        for path in publish(build(), args.publish_dir):
            print(f"published: {path}")


# ---------------------------------------------------------------------------------------- files
def problems(fig: Any) -> list[str]:
    """What is wrong with a figure's shape: missing fields, wrong types, a ratio without a baseline."""
    if not isinstance(fig, dict):
        return ["not a JSON object"]
    out = _fields(fig, FIELDS, "")
    for i, r in enumerate(fig.get("rows") or []):
        out += _fields(r, ROW_FIELDS, f"rows[{i}].")
    for i, t in enumerate(fig.get("targets") or []):
        out += _fields(t, TARGET_FIELDS, f"targets[{i}].")
    if not out and not fig["rows"]:
        out.append("no rows")
    return out


def _fields(obj: Any, spec: dict[str, type | tuple[type, ...]], where: str) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where.rstrip('.')} is not an object"]
    out = [f"{where}{k}: missing" for k in spec if k not in obj]
    out += [f"{where}{k}: unknown field" for k in obj if k not in spec]
    for k, kind in spec.items():
        # bool is an int to isinstance: a number field must not take true/false
        if k in obj and (not isinstance(obj[k], kind) or (kind is not bool and isinstance(obj[k], bool))):
            out.append(f"{where}{k}: {type(obj[k]).__name__} where {_kind(kind)} was expected")
    return out


def _kind(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def canonical(fig: dict[str, Any]) -> str:
    """The figure's canonical text, what its chart's digest is of: key order and spacing do not count."""
    return json.dumps(fig, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def digest(fig: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(fig).encode()).hexdigest()


def paths(root: Path, name: str) -> tuple[Path, Path, Path]:
    """The figure's JSON, table and chart under ``root``."""
    return root / FIGURES / f"{name}.json", root / DOCS / f"{name}.table", root / DOCS / f"{name}.svg"


def publish(fig: dict[str, Any], out_dir: Path = REPO) -> list[Path]:
    """Write the figure's JSON under ``out_dir``, then its table and chart from it; the paths written."""
    wrong = problems(fig)
    if wrong:
        raise ValueError(f"figure {fig.get('name')!r}: " + "; ".join(wrong))
    path = paths(out_dir, fig["name"])[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fig, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return [path, *render_one(path, out_dir)]


def render_one(path: Path, root: Path) -> list[Path]:
    """The table and chart of the figure in ``path``."""
    from bench._chart import write_svg

    fig = json.loads(path.read_text(encoding="utf-8"))
    wrong = problems(fig)
    if wrong:
        raise ValueError(f"{path}: " + "; ".join(wrong))
    _, table_path, svg_path = paths(root, fig["name"])
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(table(fig), encoding="utf-8")
    write_svg(fig, digest(fig), svg_path)
    return [table_path, svg_path]


def render(root: Path = REPO) -> list[Path]:
    """Every table and chart again, from ``bench/figures/*.json``."""
    return [p for path in sorted((root / FIGURES).glob("*.json")) for p in render_one(path, root)]


def check(root: Path = REPO) -> list[str]:
    """Each table or chart that does not match its JSON (tables byte for byte, charts by the digest
    they carry), each figure that is malformed, and each table or chart left without a figure."""
    from bench._chart import digest_of

    out: list[str] = []
    names = set()
    for path in sorted((root / FIGURES).glob("*.json")):
        rel = path.relative_to(root)
        try:
            fig = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            out.append(f"{rel}: not JSON ({exc})")
            continue
        wrong = problems(fig)
        if wrong:
            out.append(f"{rel}: " + "; ".join(wrong))
            continue
        if fig["name"] != path.stem:
            out.append(f"{rel}: named {fig['name']!r}, not {path.stem!r}")
            continue
        names.add(fig["name"])
        _, table_path, svg_path = paths(root, fig["name"])
        if not table_path.exists():
            out.append(f"{table_path.relative_to(root)}: missing (python bench/report.py render)")
        elif table_path.read_text(encoding="utf-8") != table(fig):
            out.append(f"{table_path.relative_to(root)}: does not match {rel} (python bench/report.py render)")
        if not svg_path.exists():
            out.append(f"{svg_path.relative_to(root)}: missing (python bench/report.py render)")
        elif digest_of(svg_path.read_text(encoding="utf-8")) != digest(fig):
            out.append(f"{svg_path.relative_to(root)}: drawn from other figures than {rel} (python bench/report.py render)")
    for path in sorted((root / DOCS).glob("*")):
        if path.suffix in (".table", ".svg") and path.stem not in names:
            out.append(f"{path.relative_to(root)}: no figure {FIGURES / (path.stem + '.json')}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("render", "check"))
    ap.add_argument("--root", type=Path, default=REPO, help="the tree holding bench/figures and docs/benchmarks")
    args = ap.parse_args(argv)
    if args.action == "render":
        for path in render(args.root):
            print(f"rendered: {path.relative_to(args.root)}")
        return 0
    found = check(args.root)
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print(f"every table and chart matches its figures ({len(list((args.root / FIGURES).glob('*.json')))} figures)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
