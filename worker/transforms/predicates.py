"""Connect's predicates: the conditions under which a transform applies (``transforms.<a>.predicate``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, non_empty
from eosink.connectors.api.records import SinkRecord
from eosink.worker.transforms.base import Predicate
from eosink.worker.transforms.regex import compile_java


class TopicNameMatches(Predicate):
    name = "TopicNameMatches"
    doc = "True for records whose whole topic name matches a Java regular expression."
    config_def = ConfigDef().define("pattern", Type.STRING, doc="Regular expression for the topic name.",
                                    importance=Importance.MEDIUM, validator=non_empty)

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._regex = compile_java(config["pattern"], key="pattern")
        self._seen: dict[str, bool] = {}

    def test(self, record: SinkRecord) -> bool:
        hit = self._seen.get(record.topic)
        if hit is None:
            hit = self._regex.fullmatch(record.topic) is not None
            if len(self._seen) < 1024:
                self._seen[record.topic] = hit
        return hit


class HasHeaderKey(Predicate):
    name = "HasHeaderKey"
    doc = "True for records with at least one header of the given name."
    config_def = ConfigDef().define("name", Type.STRING, doc="The header name.", importance=Importance.MEDIUM,
                                    validator=non_empty)

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._name: str = config["name"]

    def test(self, record: SinkRecord) -> bool:
        name = self._name
        return any(h[0] == name for h in record.headers)


class RecordIsTombstone(Predicate):
    name = "RecordIsTombstone"
    doc = "True for tombstones: records whose value is null."

    def test(self, record: SinkRecord) -> bool:
        return record.value is None
