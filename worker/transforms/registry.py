"""Every transform and predicate by the names a connector config may give as ``type``.

Connect's class names (``org.apache.kafka.connect.transforms.InsertField$Value``), their short
forms (``InsertField$Value``) and, for transforms that come as ``$Key``/``$Value``, the bare name
(``InsertField``, meaning ``$Value``, the side a sink usually cares about) all resolve here, so a
Connect config works unchanged and a hand-written one can stay short.
"""

from __future__ import annotations

from dataclasses import dataclass

from eosink.connectors.api.config import ConfigDef
from eosink.worker.transforms.base import Predicate, Transform
from eosink.worker.transforms.cast import Cast
from eosink.worker.transforms.fields import (
    ExtractField,
    Flatten,
    HoistField,
    InsertField,
    MaskField,
    ReplaceField,
    ValueToKey,
)
from eosink.worker.transforms.headers import DropHeaders, HeaderFrom, InsertHeader
from eosink.worker.transforms.predicates import HasHeaderKey, RecordIsTombstone, TopicNameMatches
from eosink.worker.transforms.routing import Filter, RegexRouter
from eosink.worker.transforms.timestamps import TimestampConverter, TimestampRouter

TRANSFORM_PACKAGE = "org.apache.kafka.connect.transforms."
PREDICATE_PACKAGE = "org.apache.kafka.connect.transforms.predicates."

TRANSFORM_CLASSES: tuple[type[Transform], ...] = (
    InsertField, ReplaceField, MaskField, Cast, TimestampConverter, ValueToKey, ExtractField, HoistField, Flatten,
    RegexRouter, TimestampRouter, Filter, DropHeaders, HeaderFrom, InsertHeader,
)
PREDICATE_CLASSES: tuple[type[Predicate], ...] = (TopicNameMatches, HasHeaderKey, RecordIsTombstone)


@dataclass(frozen=True)
class TransformType:
    """One accepted ``type``: the class, which side it works on, and Connect's full class name."""

    cls: type[Transform]
    on_key: bool
    class_name: str

    @property
    def config_def(self) -> ConfigDef:
        return self.cls.config_def


def _transform_names() -> dict[str, TransformType]:
    out: dict[str, TransformType] = {}
    for cls in TRANSFORM_CLASSES:
        variants = ((f"{cls.name}$Key", True), (f"{cls.name}$Value", False)) if cls.sided else ((cls.name, False),)
        for short, on_key in variants:
            t = TransformType(cls, on_key, TRANSFORM_PACKAGE + short)
            out[short] = out[t.class_name] = t
        if cls.sided:
            out[cls.name] = out[f"{cls.name}$Value"]
    return out


#: Every accepted transform ``type`` -> what it builds.
TRANSFORMS: dict[str, TransformType] = _transform_names()
#: Every accepted predicate ``type`` (short and full class name) -> its class.
PREDICATES: dict[str, type[Predicate]] = {
    **{cls.name: cls for cls in PREDICATE_CLASSES},
    **{PREDICATE_PACKAGE + cls.name: cls for cls in PREDICATE_CLASSES},
}
