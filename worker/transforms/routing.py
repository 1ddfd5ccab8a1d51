"""RegexRouter and Filter: the transforms that decide where a record goes, or that it goes nowhere.

A changed topic is what a sink sees as the record's destination (a table, a prefix); the engine
keeps committing offsets for the partition the record was read from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, non_empty
from eosink.connectors.api.records import SinkRecord
from eosink.worker.transforms.base import Transform, with_topic
from eosink.worker.transforms.regex import compile_java, java_replacement


class RegexRouter(Transform):
    name = "RegexRouter"
    doc = ("Rename the topic when the whole name matches regex, to replacement ($1, ${name} refer to groups); "
           "other topics are kept.")
    config_def = (
        ConfigDef()
        .define("regex", Type.STRING, doc="Java regular expression matched against the whole topic name.",
                importance=Importance.HIGH, validator=non_empty)
        .define("replacement", Type.STRING, doc="The new name; $1 / ${name} insert the regex's groups.",
                importance=Importance.HIGH)
    )

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        super().__init__(config, on_key=on_key)
        self._regex = compile_java(config["regex"], key="regex")
        self._template = java_replacement(config["replacement"], self._regex, key="replacement")
        self._cache: dict[str, str] = {}

    def apply(self, r: SinkRecord) -> SinkRecord | None:
        topic = self._cache.get(r.topic)
        if topic is None:
            m = self._regex.fullmatch(r.topic)
            topic = m.expand(self._template) if m is not None else r.topic
            if len(self._cache) < 1024:  # a connector reads few topics; bound it anyway
                self._cache[r.topic] = topic
        return r if topic == r.topic else with_topic(r, topic)


class Filter(Transform):
    name = "Filter"
    doc = "Drop the record: every record, or with a predicate only those it matches (negate=true: the others)."
    config_def = ConfigDef()

    def apply(self, r: SinkRecord) -> SinkRecord | None:
        return None
