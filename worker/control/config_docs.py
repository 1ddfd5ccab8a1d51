"""The configuration reference pages, generated from the connectors' own declarations.

Every key a connector reads is declared once (its class's ``CONFIG`` plus the engine's common keys, see
:mod:`eosink.worker.control.plugins`). Two kinds of pages are made from those declarations, so the
documentation cannot drift from what registration accepts:

* ``docs/configuration.md``: every key of every connector, the whole page generated;
* each connector's own page (``docs/connectors/<alias>.md``): hand-written prose around one generated
  block between :data:`BEGIN` and :data:`END`, holding that connector's own keys.

``eosink connectors plugins --docs`` prints the first; ``--write-docs DIR`` rewrites both in place, and
a test fails while either is stale.
"""

from __future__ import annotations

from pathlib import Path

from eosink.connectors.api.config import ConfigDef
from eosink.worker.control.plugins import Plugin, display_value, key_groups, plugins

BEGIN = "<!-- BEGIN generated configuration: eosink connectors plugins --write-docs docs -->"
END = "<!-- END generated configuration -->"
#: The connectors with a page of their own (``memory`` is the test suite's reference, ``fanout`` is
#: described on the connectors overview).
PAGES = ("postgres", "s3", "iceberg", "http", "filesystem")


def key_table(prefix: str, cdef: ConfigDef) -> list[str]:
    """A Markdown table of ``cdef``'s keys, each shown with ``prefix``."""
    lines = ["| key | type | default | importance | description |", "|---|---|---|---|---|"]
    for key in cdef.keys.values():
        default = "*required*" if key.required else f"`{display_value(key.default)}`"
        doc = key.doc.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{prefix}{key.name}` | {key.type.value} | {default} | {key.importance.value} | {doc} |")
    return lines


def render_markdown() -> str:
    """``docs/configuration.md``: every key of every connector."""
    lines = ["# Connector configuration", "",
             "Generated from the declared configuration (`eosink connectors plugins --docs`); do not edit by hand.", "",
             "Values may be `${env:VAR}` or `${file:/path:key}` (resolved by the worker that runs the connector). "
             "`PASSWORD` values are shown as `[hidden]` in every response and log line.", ""]
    seen: set[str] = set()
    for p in plugins():
        for group, prefix, cdef in key_groups(p, {}):
            if group in seen:
                continue  # Common and Error Handling: once
            seen.add(group)
            title = f"{p.alias} (`{p.class_name}`)" if group == p.alias and p.cls is not None else group
            lines += [f"## {title}", "", *key_table(prefix, cdef), ""]
    return "\n".join(lines)


def _plugin(alias: str) -> Plugin:
    for p in plugins():
        if p.alias == alias:
            return p
    raise KeyError(f"no connector plugin {alias!r} can be loaded here")


def render_connector_block(alias: str) -> str:
    """The generated block of ``docs/connectors/<alias>.md``: the connector's own keys (the common and
    error-handling keys every connector reads are on the configuration page, linked from the block)."""
    p = _plugin(alias)
    assert p.cls is not None
    lines = [BEGIN, "", f"`connector.class`: `{alias}` or `{p.class_name}`. The keys every connector reads "
             "(topics, converters, cycle length, errors) are in [the configuration reference](../configuration.md#common).",
             "", *key_table("", p.cls.CONFIG), "", END]
    return "\n".join(lines)


def replace_block(text: str, block: str, where: str) -> str:
    """``text`` with its generated block replaced by ``block``; a page without the markers is an error
    naming it (a generated table must have a place, not be appended somewhere)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{where}: no generated block (the lines {BEGIN!r} ... {END!r})")
    return text[:start] + block + text[end + len(END):]


def _current(docs: Path) -> dict[Path, tuple[str, str]]:
    """Each generated page under ``docs``: (its text now, the text the declarations make)."""
    pages = {docs / "configuration.md": render_markdown() + "\n"}
    out = {path: (path.read_text(), want) for path, want in pages.items()}
    for alias in PAGES:
        page = docs / "connectors" / f"{alias}.md"
        text = page.read_text()
        out[page] = (text, replace_block(text, render_connector_block(alias), str(page)))
    return out


def stale_pages(docs: Path) -> list[str]:
    """The generated pages under ``docs`` that differ from what the declarations make now."""
    return [str(path) for path, (now, want) in _current(docs).items() if now != want]


def write_docs(docs: Path) -> list[str]:
    """Rewrite the stale generated pages under ``docs``; returns them."""
    changed = []
    for path, (now, want) in _current(docs).items():
        if now != want:
            path.write_text(want)
            changed.append(str(path))
    return changed
