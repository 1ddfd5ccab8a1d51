"""TimestampConverter and TimestampRouter: Connect's time-aware transforms, always in UTC.

Connect's logical types map to Python's: ``Timestamp`` is a UTC ``datetime``, ``Date`` a ``date``
(midnight), ``Time`` a ``time`` (on 1970-01-01); ``unix`` is an integer count of
``unix.precision`` units and ``string`` follows ``format`` (see ``dateformat.py``). Internally
every conversion goes through epoch milliseconds, as Connect's go through ``java.util.Date``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, one_of
from eosink.connectors.api.errors import ConfigError
from eosink.connectors.api.records import SinkRecord
from eosink.worker.transforms.base import BadRecord, MapTransform, Transform, type_name, with_topic
from eosink.worker.transforms.dateformat import EPOCH, DateFormat, compile_format

_MS = dt.timedelta(milliseconds=1)
_PER_MS = {"seconds": (1000, 1), "milliseconds": (1, 1), "microseconds": (1, 1000), "nanoseconds": (1, 1_000_000)}
TARGET_TYPES = ("string", "unix", "Date", "Time", "Timestamp")


def _tdiv(a: int, b: int) -> int:
    """Integer division truncating toward zero, as Java's TimeUnit conversions do."""
    q = abs(a) // b
    return q if a >= 0 else -q


class TimestampConverter(MapTransform):
    name = "TimestampConverter"
    sided = True
    doc = "Convert a timestamp (the whole key/value, or one field of a map) between string, unix, Date, Time and Timestamp."
    config_def = (
        ConfigDef()
        .define("field", Type.STRING, "", "Field holding the timestamp; empty = the entire key/value.", Importance.HIGH)
        .define("target.type", Type.STRING, doc="string, unix, Date, Time or Timestamp.", importance=Importance.HIGH,
                validator=one_of(*TARGET_TYPES))
        .define("format", Type.STRING, "", "Java SimpleDateFormat pattern for string input and output; supported "
                "letters: yyyy MM dd HH mm ss SSS, with quoted literals ('T').", Importance.MEDIUM)
        .define("unix.precision", Type.STRING, "milliseconds", "Unit of unix timestamps, read and written: "
                "seconds, milliseconds, microseconds or nanoseconds.", Importance.LOW, one_of(*_PER_MS))
    )

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        super().__init__(config, on_key=on_key)
        self._field: str = config.get("field") or ""
        self._target: str = config["target.type"]
        pattern = config.get("format") or ""
        if self._target == "string" and not pattern:
            raise ConfigError("is required when target.type is string", key="format")
        self._format: DateFormat | None = compile_format(pattern, key="format") if pattern else None
        self._mul, self._div = _PER_MS[config.get("unix.precision") or "milliseconds"]

    # -- any supported input -> epoch ms -----------------------------------------------------------------------------
    def _to_ms(self, x: Any) -> int:
        t = type(x)
        if t is int:
            return x * self._mul if self._mul != 1 else _tdiv(x, self._div)
        if t is str:
            if self._format is None:
                raise BadRecord("a string timestamp needs the format setting")
            try:
                return self._format.parse(x)
            except (ValueError, OverflowError) as exc:
                raise BadRecord(str(exc)) from None
        if isinstance(x, dt.datetime):
            when = x if x.tzinfo is not None else x.replace(tzinfo=dt.UTC)
            return (when - EPOCH) // _MS
        if isinstance(x, dt.date):
            return (dt.datetime(x.year, x.month, x.day, tzinfo=dt.UTC) - EPOCH) // _MS
        if isinstance(x, dt.time):
            return (x.hour * 3600 + x.minute * 60 + x.second) * 1000 + x.microsecond // 1000
        raise BadRecord(f"cannot read a timestamp from a value of type {type_name(x)}")

    def _from_ms(self, ms: int) -> Any:
        target = self._target
        if target == "unix":
            return _tdiv(ms, self._mul) if self._mul != 1 else ms * self._div
        if target == "string":
            assert self._format is not None
            return self._format.format(ms)
        when = EPOCH + dt.timedelta(milliseconds=ms)
        if target == "Timestamp":
            return when
        if target == "Date":
            return when.date()
        return when.time()

    def convert(self, x: Any) -> Any:
        try:
            return self._from_ms(self._to_ms(x))
        except OverflowError:
            raise BadRecord(f"timestamp {x!r} is out of range") from None

    def map(self, r: SinkRecord, v: Any) -> Any:
        if v is None:
            return v
        if not self._field:
            return self.convert(v)
        if type(v) is not dict:
            raise self.not_a_map(v, "converting a timestamp field")
        x = v.get(self._field)
        new = v.copy()
        try:
            new[self._field] = None if x is None else self.convert(x)
        except BadRecord as exc:
            raise BadRecord(exc.message, self._field) from None
        return new


class TimestampRouter(Transform):
    name = "TimestampRouter"
    doc = "Rename the topic from its name and the record's timestamp (a table per day, say)."
    config_def = (
        ConfigDef()
        .define("topic.format", Type.STRING, "${topic}-${timestamp}", "The new topic name; ${topic} and ${timestamp} "
                "are replaced.", Importance.HIGH)
        .define("timestamp.format", Type.STRING, "yyyyMMdd", "Java SimpleDateFormat pattern for ${timestamp} (UTC); "
                "supported letters: yyyy MM dd HH mm ss SSS.", Importance.HIGH)
    )

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        super().__init__(config, on_key=on_key)
        fmt = config.get("topic.format") or "${topic}-${timestamp}"
        self._template = fmt.replace("{", "{{").replace("}", "}}").replace("${{topic}}", "{0}") \
            .replace("${{timestamp}}", "{1}")
        self._format = compile_format(config.get("timestamp.format") or "yyyyMMdd", key="timestamp.format")

    def apply(self, r: SinkRecord) -> SinkRecord | None:
        try:
            stamp = self._format.format(r.timestamp_ms)
        except OverflowError:
            raise BadRecord(f"timestamp {r.timestamp_ms} is out of range") from None
        return with_topic(r, self._template.format(r.topic, stamp))
