"""What every transform and predicate is made of, and the helpers they share.

A transform is configured once (``__init__`` receives its keys already coerced by its
:class:`~eosink.connectors.api.config.ConfigDef`) and then called once per record, so everything a
record does not decide (field lists, regexes, date patterns) is computed in ``__init__`` and
``apply`` only touches the record. ``apply`` never mutates its input: it returns the same record
untouched, a new one, or ``None`` (dropped).

A transform signals a bad record by raising :class:`BadRecord` with a short reason; the chain adds
the record's coordinates and the transform's alias and class (see ``chain.py``), so transforms stay
free of bookkeeping.

Records are rebuilt with :func:`with_value` / :func:`with_key` / :func:`with_headers` /
:func:`with_topic` rather than ``dataclasses.replace``: they call the constructor directly, which
is about three times faster on the hot path (the set of fields is pinned by a test, so a new
``SinkRecord`` field cannot be dropped silently).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from eosink.connectors.api.config import ConfigDef
from eosink.connectors.api.records import SinkRecord

#: The field names of SinkRecord the helpers below copy, in constructor order.
RECORD_FIELDS = ("topic", "partition", "offset", "key", "value", "raw_value", "headers", "timestamp_ms", "value_schema")

Header = tuple[str, bytes | None]


class BadRecord(Exception):
    """Raised by a transform for a record it cannot process; ``field`` names the field if any."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def with_value(r: SinkRecord, value: Any) -> SinkRecord:
    """``r`` with a new value; ``raw_value`` is cleared so a sink re-encodes the value, and ``value_schema``
    so a sink types its columns from the new value, not from a schema it may no longer match."""
    return SinkRecord(r.topic, r.partition, r.offset, r.key, value, None, r.headers, r.timestamp_ms)


def with_key(r: SinkRecord, key: Any) -> SinkRecord:
    """``r`` with a new key (a transform may leave a map there, as Connect's schemaless keys are)."""
    return SinkRecord(r.topic, r.partition, r.offset, key, r.value, r.raw_value, r.headers, r.timestamp_ms, r.value_schema)


def with_headers(r: SinkRecord, headers: tuple[Header, ...]) -> SinkRecord:
    return SinkRecord(r.topic, r.partition, r.offset, r.key, r.value, r.raw_value, headers,  # type: ignore[arg-type]
                      r.timestamp_ms, r.value_schema)


def with_topic(r: SinkRecord, topic: str) -> SinkRecord:
    return SinkRecord(topic, r.partition, r.offset, r.key, r.value, r.raw_value, r.headers, r.timestamp_ms, r.value_schema)


def type_name(v: Any) -> str:
    """How a value's type is named in errors: JSON's words where there is one."""
    if v is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
            bytes: "bytes (value.converter=bytes)"}.get(type(v), type(v).__name__)


class Transform:
    """One configured Single Message Transform.

    Subclasses set ``name`` (Connect's simple class name), ``config_def`` and ``doc``;
    ``sided`` is True for transforms that come as ``$Key`` and ``$Value`` (``on_key`` tells which).
    """

    name: ClassVar[str] = ""
    doc: ClassVar[str] = ""
    config_def: ClassVar[ConfigDef] = ConfigDef()
    sided: ClassVar[bool] = False

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        self.on_key = on_key
        self.what = "key" if on_key else "value"

    def apply(self, record: SinkRecord) -> SinkRecord | None:
        raise NotImplementedError

    def not_a_map(self, v: Any, purpose: str) -> BadRecord:
        """Connect's ``requireMap`` failure, in this record's words."""
        return BadRecord(f"{purpose} needs the {self.what} to be a JSON object (a map), found {type_name(v)}")


class MapTransform(Transform):
    """A transform that only replaces the key or the value, computed from it (and the record's metadata).

    ``map(record, operand)`` returns the new key/value, or ``operand`` itself when nothing changes
    (the record is then passed on as it is, ``raw_value`` intact). The chain runs consecutive
    ungated ``$Value`` map transforms on the value alone and rebuilds the record once.
    """

    #: ``map`` returns JSON-typed values (dict, list, str, int, float, bool, None - what value.converter=json
    #: decodes) whenever it is given one: the chain may then write the new value's JSON itself (see chain.py).
    json_preserving: ClassVar[bool] = False
    #: ``map``, when it changes the operand, returns a new dict or list that nothing else holds (its
    #: elements may be the operand's): a later stage of the same run may then ``edit`` it in place.
    fresh: ClassVar[bool] = False

    def map(self, r: SinkRecord, v: Any) -> Any:
        raise NotImplementedError

    def edit(self, r: SinkRecord, v: dict[str, Any]) -> Any:
        """``map(r, v)`` for a dict the chain made and nobody else holds: it may be changed in place
        and returned, which spares the copy ``map`` makes. By default, ``map``."""
        return self.map(r, v)

    def apply(self, r: SinkRecord) -> SinkRecord | None:
        v = r.key if self.on_key else r.value
        new = self.map(r, v)
        if new is v:
            return r
        return with_key(r, new) if self.on_key else with_value(r, new)


class Predicate:
    """One configured predicate: ``test`` is called per record, before its transform."""

    name: ClassVar[str] = ""
    doc: ClassVar[str] = ""
    config_def: ClassVar[ConfigDef] = ConfigDef()

    def __init__(self, config: Mapping[str, Any]) -> None:
        pass

    def test(self, record: SinkRecord) -> bool:
        raise NotImplementedError
