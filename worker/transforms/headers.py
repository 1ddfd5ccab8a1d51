"""The header transforms: DropHeaders, InsertHeader and HeaderFrom (fields of a map into headers).

Headers are ``(name, bytes)`` pairs on the wire. A field copied into a header is encoded the way
a string header converter would write it: text as UTF-8, bytes as they are, anything else as
compact JSON (``true``, ``42``, ``{"a":1}``); a null field becomes a header with a null value,
as in Connect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, non_empty, one_of
from eosink.connectors.api.errors import ConfigError
from eosink.connectors.api.records import SinkRecord
from eosink.worker.transforms.base import Header, Transform, with_headers, with_key, with_value


def header_bytes(x: Any) -> bytes | None:
    if x is None:
        return None
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    return json.dumps(x, separators=(",", ":"), default=str).encode()


class DropHeaders(Transform):
    name = "DropHeaders"
    doc = "Remove every header with one of the given names."
    config_def = ConfigDef().define("headers", Type.LIST, doc="Names of the headers to remove.",
                                    importance=Importance.HIGH, validator=non_empty)

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        super().__init__(config, on_key=on_key)
        self._names = frozenset(config["headers"])

    def apply(self, r: SinkRecord) -> SinkRecord | None:
        names = self._names
        kept = tuple(h for h in r.headers if h[0] not in names)
        return r if len(kept) == len(r.headers) else with_headers(r, kept)


class InsertHeader(Transform):
    name = "InsertHeader"
    doc = "Add a header with a literal value (the value's text, as UTF-8)."
    config_def = (
        ConfigDef()
        .define("header", Type.STRING, doc="Name of the header.", importance=Importance.HIGH, validator=non_empty)
        .define("value.literal", Type.STRING, doc="Literal value of the header.", importance=Importance.HIGH)
    )

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        super().__init__(config, on_key=on_key)
        self._header: Header = (config["header"], config["value.literal"].encode())

    def apply(self, r: SinkRecord) -> SinkRecord | None:
        return with_headers(r, (*r.headers, self._header))


class HeaderFrom(Transform):
    name = "HeaderFrom"
    sided = True
    doc = "Copy or move fields of a map into headers (fields[i] becomes header headers[i])."
    config_def = (
        ConfigDef()
        .define("fields", Type.LIST, doc="Fields whose values become headers.", importance=Importance.HIGH,
                validator=non_empty)
        .define("headers", Type.LIST, doc="Header names, in the order of fields.", importance=Importance.HIGH,
                validator=non_empty)
        .define("operation", Type.STRING, doc="move (remove the fields) or copy (keep them).",
                importance=Importance.HIGH, validator=one_of("move", "copy"))
    )

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        super().__init__(config, on_key=on_key)
        fields, headers = config["fields"], config["headers"]
        if len(fields) != len(headers):
            raise ConfigError(f"must have as many names as fields ({len(headers)} headers for {len(fields)} fields)",
                              key="headers")
        self._pairs = tuple(zip(fields, headers))
        self._move = frozenset(fields) if config["operation"] == "move" else None

    def apply(self, r: SinkRecord) -> SinkRecord | None:
        v = r.key if self.on_key else r.value
        if type(v) is not dict:
            raise self.not_a_map(v, f"header {'move' if self._move is not None else 'copy'}")
        added = tuple((h, header_bytes(v.get(f))) for f, h in self._pairs)
        headers = (*r.headers, *added)
        if self._move is None:
            return with_headers(r, headers)
        moved = self._move
        rest = {k: x for k, x in v.items() if k not in moved}
        out = with_key(r, rest) if self.on_key else with_value(r, rest)
        return with_headers(out, headers)
