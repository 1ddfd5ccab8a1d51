"""The writer's schema of a record read with a Schema Registry converter (Avro, Protobuf, JSON Schema).

The value a sink gets is JSON-like (:mod:`eosink.worker.engine.registry_converters`), which loses what
the schema says: a decimal's precision, that a text is a timestamp, that a field may not be null. A
sink that creates or evolves a table needs exactly that, so each such record carries its
:class:`WriterSchema` in :attr:`~eosink.connectors.api.records.SinkRecord.value_schema`: one object per
schema id, made once when the id is first fetched and shared by every record written with it - the
per-record cost is one reference, and a sink can cache what it derives from a schema by its id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: ``(subject, version)`` pairs a registry lists for a schema id (asked only when a message needs them).
Versions = Callable[[], list[tuple[str, int]]]
#: The schema id of ``(subject, version)`` in the same registry.
VersionId = Callable[[str, int], int]


def _none() -> list[tuple[str, int]]:
    return []


def _unknown(subject: str, version: int) -> int:
    raise LookupError(f"{subject} version {version}")


@dataclass(eq=False, slots=True)
class WriterSchema:
    """One registered schema, as the converter fetched it: identity is the object (one per id)."""

    id: int
    #: ``avro``, ``protobuf`` or ``jsonschema``.
    format: str
    #: The schema as registered (Avro and JSON Schema: JSON text; Protobuf: the .proto text).
    text: str
    #: The registry's address, for messages.
    registry: str = ""
    versions_of: Versions = field(default=_none, repr=False)
    version_id: VersionId = field(default=_unknown, repr=False)
    _document: Any = field(default=None, repr=False)
    #: Protobuf: the schema's ``FileDescriptorProto``, as the converter built it from :attr:`text`.
    parsed: Any = field(default=None, repr=False)
    #: Protobuf: the same file as the converter's descriptor pool resolved it (a ``FileDescriptor``): its
    #: fields' message types point at their definitions, imported ones (well-known types, references) too,
    #: which a sink typing nested messages as structs needs and the bare ``FileDescriptorProto`` only names.
    descriptor: Any = field(default=None, repr=False)
    _versions: list[tuple[str, int]] | None = field(default=None, repr=False)

    @property
    def document(self) -> Any:
        """The parsed JSON of an Avro or JSON Schema schema (parsed once)."""
        if self._document is None:
            self._document = json.loads(self.text)
        return self._document

    def versions(self) -> list[tuple[str, int]]:
        """Subjects and versions the registry has this schema under; empty if it cannot tell (asked once)."""
        if self._versions is None:
            try:
                self._versions = sorted(self.versions_of())
            except Exception:  # noqa: BLE001 - only for messages: a registry that cannot tell names no version
                self._versions = []
        return self._versions

    def _pick(self, subject: str | None) -> tuple[str, int] | None:
        found = self.versions()
        return next((sv for sv in found if sv[0] == subject), found[0] if found else None)

    def describe(self, subject: str | None = None) -> str:
        """``subject 'orders-value' version 2 (schema id 12)``, or ``schema id 12`` when no version is known;
        ``subject`` picks among several subjects (e.g. the topic's ``<topic>-value``)."""
        pick = self._pick(subject)
        if pick is None:
            return f"schema id {self.id}"
        return f"subject '{pick[0]}' version {pick[1]} (schema id {self.id})"

    def previous(self, subject: str | None = None) -> str | None:
        """The version registered before this one under its subject, as :meth:`describe` names it; None
        for a first version or when the registry cannot tell."""
        pick = self._pick(subject)
        if pick is None or pick[1] <= 1:
            return None
        try:
            return f"subject '{pick[0]}' version {pick[1] - 1} (schema id {self.version_id(pick[0], pick[1] - 1)})"
        except Exception:  # noqa: BLE001 - only for messages
            return None
