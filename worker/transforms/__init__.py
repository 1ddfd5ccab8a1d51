"""Kafka Connect's Single Message Transforms and predicates, for the records a connector delivers.

A connector's ``transforms=...`` / ``predicates=...`` keys build a :class:`TransformChain`
(:func:`build_chain`); the engine calls ``chain.apply(record)`` per record after decoding and
before ``sink.write`` (``None``: the record is dropped; :class:`TransformError`: a bad record,
stage ``TRANSFORMATION``). Keys, class names and semantics are Connect's, so a Connect config
works unchanged; :func:`definitions` lists every transform and predicate with its keys, for docs.
"""

from __future__ import annotations

from dataclasses import dataclass

from eosink.connectors.api.config import ConfigDef
from eosink.worker.transforms.base import BadRecord, Predicate, Transform
from eosink.worker.transforms.chain import (
    CHAIN_KEYS,
    STAGE,
    Stage,
    TransformChain,
    TransformError,
    build_chain,
    chain_config_def,
    validate_chain,
)
from eosink.worker.transforms.registry import PREDICATE_CLASSES, PREDICATES, TRANSFORM_CLASSES, TRANSFORMS


@dataclass(frozen=True)
class Definition:
    """One transform or predicate as docs show it: Connect's class name(s), purpose and keys."""

    kind: str  # "transform" | "predicate"
    name: str
    class_names: tuple[str, ...]
    doc: str
    config_def: ConfigDef


def definitions() -> list[Definition]:
    """Every transform and predicate, in the order Connect's docs list them."""
    out = []
    for cls in TRANSFORM_CLASSES:
        names = tuple(t.class_name for n, t in TRANSFORMS.items() if t.cls is cls and n == t.class_name)
        out.append(Definition("transform", cls.name, names, cls.doc, cls.config_def))
    for p in PREDICATE_CLASSES:
        names = tuple(n for n, c in PREDICATES.items() if c is p and "." in n)
        out.append(Definition("predicate", p.name, names, p.doc, p.config_def))
    return out


__all__ = [
    "CHAIN_KEYS", "PREDICATES", "STAGE", "TRANSFORMS", "BadRecord", "Definition", "Predicate", "Stage", "Transform",
    "TransformChain", "TransformError", "build_chain", "chain_config_def", "definitions", "validate_chain",
]
