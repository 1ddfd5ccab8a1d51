"""A connector's transform chain, built from its flat config exactly as Kafka Connect reads it.

    transforms=mask,route
    transforms.mask.type=org.apache.kafka.connect.transforms.MaskField$Value
    transforms.mask.fields=email
    transforms.route.type=RegexRouter
    transforms.route.regex=orders-(.*)
    transforms.route.replacement=$1
    transforms.route.predicate=isOrders
    transforms.route.negate=false
    predicates=isOrders
    predicates.isOrders.type=TopicNameMatches
    predicates.isOrders.pattern=orders-.*

Everything is checked when the chain is built: a misspelt key under ``transforms.<alias>.`` (with
the closest known key as a hint), a missing or unknown ``type``, an undeclared predicate. The
engine calls :meth:`TransformChain.apply` once per record after decoding and before
``sink.write``; ``None`` means the record was dropped. A record a transform cannot process raises
:class:`TransformError` (a :class:`RecordError`), which the engine routes by ``errors.tolerance``
with the stage ``TRANSFORMATION``.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.config import ConfigDef, ConfigKey, Importance, Type
from eosink.connectors.api.errors import ConfigError, RecordError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.common.jsoncodec import encode_json_value
from eosink.worker.transforms.base import BadRecord, MapTransform, Predicate, Transform
from eosink.worker.transforms.registry import PREDICATES, TRANSFORMS

STAGE = "TRANSFORMATION"
_CONTAINERS = frozenset((dict, list))
#: Keys every transform alias accepts besides its own.
CHAIN_KEYS = (
    ConfigDef()
    .define("type", Type.STRING, doc="The transform's class: Connect's class name or its short form.",
            importance=Importance.HIGH)
    .define("predicate", Type.STRING, None, "Apply the transform only to records this predicate alias matches.")
    .define("negate", Type.BOOLEAN, False, "Apply the transform to the records the predicate does not match.")
)
_LIST = ConfigKey("transforms", Type.LIST, "")


class _UnknownKeys(ConfigError):
    """Several unknown keys under one alias: raised as the first, reported (by validate) as all."""

    def __init__(self, errors: list[ConfigError]) -> None:
        super().__init__(errors[0].message.split(": ", 1)[-1], key=errors[0].key)
        self.all = errors


class TransformError(RecordError):
    """A transform could not process a record. ``alias`` and ``transform_type`` name the stage."""

    stage = STAGE

    def __init__(self, message: str, *, record: SinkRecord, alias: str, transform_type: str,
                 column: str | None = None) -> None:
        super().__init__(f"transform '{alias}' ({transform_type}) failed: {message}", topic=record.topic,
                         partition=record.partition, offset=record.offset, column=column,
                         component=f"transforms.{alias}")
        self.alias = alias
        self.transform_type = transform_type


@dataclass(frozen=True)
class Stage:
    """One ``transforms`` alias: its transform and, optionally, the predicate that gates it."""

    alias: str
    type: str
    transform: Transform
    predicate: Predicate | None = None
    predicate_alias: str | None = None
    negate: bool = False

    def runner(self) -> Callable[[SinkRecord], SinkRecord | None]:
        """The per-record call, with the predicate folded in so the chain's loop stays flat."""
        apply, pred = self.transform.apply, self.predicate
        if pred is None:
            return apply
        test, negate = pred.test, self.negate

        def gated(r: SinkRecord) -> SinkRecord | None:
            return apply(r) if test(r) is not negate else r

        return gated

    def failure(self, record: SinkRecord, exc: Exception) -> TransformError:
        if isinstance(exc, BadRecord):
            return TransformError(exc.message, record=record, alias=self.alias, transform_type=self.type,
                                  column=exc.field)
        return TransformError(f"{type(exc).__name__}: {exc}", record=record, alias=self.alias,
                              transform_type=self.type)


class _StageFailed(Exception):
    """Raised out of a fused run of stages: which stage failed, and how."""

    def __init__(self, stage: Stage, exc: Exception) -> None:
        super().__init__(str(exc))
        self.stage = stage
        self.exc = exc


def _fusable(s: Stage) -> bool:
    return isinstance(s.transform, MapTransform) and not s.transform.on_key and s.predicate is None


def _fused(stages: tuple[Stage, ...], owned_input: bool = False, last: bool = False,
           ) -> Callable[[SinkRecord], SinkRecord | None]:
    """Consecutive ungated ``$Value`` map transforms as one call: the value passes through each, and
    the record is rebuilt once (a SinkRecord costs about as much as a small transform). A dict one
    stage made is the chain's own, so the next stage edits it in place (``MapTransform.edit``)
    instead of copying it again.

    A transformed value has no bytes on the topic any more, so a sink writing JSON would encode it
    with ``json.dumps``' exact bytes, checking every field on the way (~1.2 us per ~200-byte value,
    more than the transforms themselves). When the record's value was decoded from its JSON bytes
    (``raw_value`` set, the value a dict or a list: ``value.converter=json``) and every stage keeps
    values JSON-typed, the new value's JSON is written here instead, natively, as its ``raw_value``
    (``jsoncodec.encode_json_value``: bytes ``json.loads`` reads back as the value; where it cannot
    promise that, ``raw_value`` stays None and the sink encodes exactly).

    With ``owned_input`` the record's own value, when a dict, is edited in place from the first
    stage on: the caller vouches that nothing else reads it (``TransformChain.apply_owned``). When
    this run is also the chain's ``last``, the record itself takes the new value and raw_value: no
    later stage can fail on it, so nobody needs it as it was read."""
    maps = tuple((s, s.transform.map, s.transform.edit, s.transform.fresh) for s in stages)  # type: ignore[attr-defined]
    to_json = encode_json_value if all(s.transform.json_preserving for s in stages) else None  # type: ignore[attr-defined]
    in_place = owned_input and last

    def run(r: SinkRecord) -> SinkRecord | None:
        v = v0 = r.value
        # v is a dict nobody else holds: this run made it, or the caller gave the record's own
        owned = edited = owned_input and v0.__class__ is dict
        for stage, map_, edit, fresh in maps:
            try:
                new = edit(r, v) if owned else map_(r, v)
            except Exception as exc:
                raise _StageFailed(stage, exc) from exc
            if new is not v:
                owned = fresh and new.__class__ is dict
                v = new
        if v is v0 and not edited:
            return r
        raw = None
        if to_json is not None and r.raw_value is not None and v0.__class__ in _CONTAINERS and v.__class__ in _CONTAINERS:
            raw = to_json(v)
        if in_place:
            r.value, r.raw_value = v, raw
            return r
        return SinkRecord(r.topic, r.partition, r.offset, r.key, v, raw, r.headers, r.timestamp_ms)

    return run


def _runs(stages: tuple[Stage, ...], owned_first: bool = False,
          ) -> tuple[tuple[Stage, Callable[[SinkRecord], SinkRecord | None]], ...]:
    out: list[tuple[Stage, Callable[[SinkRecord], SinkRecord | None]]] = []
    i = 0
    while i < len(stages):
        j = i
        while j < len(stages) and _fusable(stages[j]):
            j += 1
        if j > i:
            out.append((stages[i], _fused(stages[i:j], owned_first and i == 0, last=j == len(stages))))
            i = j
        else:
            out.append((stages[i], stages[i].runner()))
            i += 1
    return tuple(out)


Run = Callable[[SinkRecord], SinkRecord | None]


def _through(runs: tuple[tuple[Stage, Run], ...]) -> Run:
    """One call per record through ``runs``, failures named after the stage and the record as read."""
    if len(runs) == 1:  # one call fewer per record for the usual chain: one run of value transforms
        stage0, run0 = runs[0]

        def one(record: SinkRecord) -> SinkRecord | None:
            try:
                return run0(record)
            except _StageFailed as failed:
                raise failed.stage.failure(record, failed.exc) from failed.exc
            except Exception as exc:
                raise stage0.failure(record, exc) from exc

        return one

    def every(record: SinkRecord) -> SinkRecord | None:
        out: SinkRecord | None = record
        stage = None
        try:
            for stage, run in runs:  # noqa: B007 - the except clauses below name the stage that raised
                out = run(out)  # type: ignore[arg-type]
                if out is None:
                    return None
        except _StageFailed as failed:
            raise failed.stage.failure(record, failed.exc) from failed.exc
        except Exception as exc:
            assert stage is not None
            raise stage.failure(record, exc) from exc
        return out

    return every


class TransformChain:
    """The configured transforms, in order. Empty (falsy) when the connector declares none."""

    def __init__(self, stages: tuple[Stage, ...] = ()) -> None:
        self.stages = stages
        self._runs = _runs(stages)
        self._owned_runs = _runs(stages, owned_first=True)
        self._apply = _through(self._runs)
        self._apply_owned = _through(self._owned_runs)

    def __len__(self) -> int:
        return len(self.stages)

    def __bool__(self) -> bool:
        return bool(self.stages)

    def apply(self, record: SinkRecord) -> SinkRecord | None:
        """``record`` through every stage; ``None`` once a stage drops it. Raises TransformError naming
        the record as it was read (a router before the failing stage does not change the coordinates)."""
        return self._apply(record)

    def apply_owned(self, record: SinkRecord) -> SinkRecord | None:
        """:meth:`apply` for a record nobody else reads, value included (the engine's freshly decoded
        batch): leading ``$Value`` field transforms edit that dict in place instead of copying it, and
        when they end the chain the record itself is updated and returned. A copy of a ~200-byte
        value and a new record, kept until the cycle ends, cost about as much as the transforms."""
        return self._apply_owned(record)

    def runner(self, *, owned: bool = False) -> Callable[[SinkRecord], SinkRecord | None]:
        """What :meth:`apply` (or, ``owned``, :meth:`apply_owned`) calls, for a loop over a batch: a
        method's frame per record is a tenth of what two small transforms cost."""
        return self._apply_owned if owned else self._apply

    @staticmethod
    def validate(config: Mapping[str, Any]) -> list[ConfigError]:
        """Every problem of the chain's config, each naming its full key (the validate endpoint's view)."""
        return validate_chain(config)

    @staticmethod
    def config_def(config: Mapping[str, Any]) -> ConfigDef:
        """The chain's keys under their full names (``transforms.mask.fields``), for docs and validation."""
        return chain_config_def(config)


def build_chain(config: Mapping[str, Any]) -> TransformChain:
    """The chain ``config`` declares; the first problem is raised as a ConfigError naming its key."""
    return TransformChain(_stages(config, None))


def validate_chain(config: Mapping[str, Any]) -> list[ConfigError]:
    errors: list[ConfigError] = []
    _stages(config, errors)
    return errors


def chain_config_def(config: Mapping[str, Any]) -> ConfigDef:
    out = ConfigDef()
    for kind, prefix, names in (("transforms", "transforms.", _aliases(config, "transforms")),
                                ("predicates", "predicates.", _aliases(config, "predicates"))):
        for alias in names:
            base = f"{prefix}{alias}."
            type_name = str(config.get(base + "type") or "").strip()
            own = _own_def(kind, type_name)
            extra = CHAIN_KEYS.keys.values() if kind == "transforms" else [CHAIN_KEYS.keys["type"]]
            for key in [*extra, *(own.keys.values() if own else ())]:
                out.define(base + key.name, key.type, key.default, key.doc, key.importance, None)
    return out


# -- building ------------------------------------------------------------------------------------------------------------
def _aliases(config: Mapping[str, Any], key: str) -> list[str]:
    return list(ConfigKey(key, Type.LIST, "").coerce(config.get(key) or ""))


def _own_def(kind: str, type_name: str) -> ConfigDef | None:
    if kind == "transforms":
        t = TRANSFORMS.get(type_name)
        return t.config_def if t else None
    p = PREDICATES.get(type_name)
    return p.config_def if p else None


def _reworded(exc: ConfigError, prefix: str) -> ConfigError:
    """``exc`` (raised against a transform's own key) under the key's full name."""
    message = exc.message.split(": ", 1)[-1] if exc.key else exc.message
    return ConfigError(message, key=prefix + exc.key if exc.key else None)


def _unknown_keys(config: Mapping[str, Any], prefix: str, known: list[str]) -> list[ConfigError]:
    errors = []
    for full in config:
        if not full.startswith(prefix):
            continue
        key = full[len(prefix):]
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean `{prefix}{close[0]}`?" if close else f"known keys: {', '.join(prefix + k for k in known)}"
        errors.append(ConfigError(f"unknown key; {hint}", key=full))
    return errors


def _type_of(config: Mapping[str, Any], prefix: str, names: Mapping[str, Any], what: str) -> Any:
    raw = config.get(prefix + "type")
    name = str(raw).strip() if raw is not None else ""
    if not name:
        raise ConfigError(f"is required: the {what}'s class", key=prefix + "type")
    if name not in names:
        close = difflib.get_close_matches(name, list(names), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown {what} class {name!r}{hint}", key=prefix + "type")
    return names[name]


def _parse_own(config: Mapping[str, Any], prefix: str, own: ConfigDef) -> dict[str, Any]:
    sub = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
    try:
        return own.parse(sub)
    except ConfigError as exc:
        raise _reworded(exc, prefix) from None


def _predicate(config: Mapping[str, Any], alias: str) -> Predicate:
    prefix = f"predicates.{alias}."
    cls: type[Predicate] = _type_of(config, prefix, PREDICATES, "predicate")
    unknown = _unknown_keys(config, prefix, ["type", *cls.config_def.keys])
    if unknown:
        raise _UnknownKeys(unknown)
    try:
        return cls(_parse_own(config, prefix, cls.config_def))
    except ConfigError as exc:
        raise exc if (exc.key or "").startswith(prefix) else _reworded(exc, prefix) from None


def _stage(config: Mapping[str, Any], alias: str, predicates: Mapping[str, Predicate | None]) -> Stage:
    prefix = f"transforms.{alias}."
    t = _type_of(config, prefix, TRANSFORMS, "transform")
    unknown = _unknown_keys(config, prefix, [*CHAIN_KEYS.keys, *t.config_def.keys])
    if unknown:
        raise _UnknownKeys(unknown)
    chain = _parse_own(config, prefix, CHAIN_KEYS)
    pred_alias = (chain.get("predicate") or "").strip() or None
    if pred_alias is not None and pred_alias not in predicates:
        declared = ", ".join(predicates) or "none"
        raise ConfigError(f"names predicate {pred_alias!r}, which 'predicates' does not declare (declared: {declared})",
                          key=prefix + "predicate")
    if chain["negate"] and pred_alias is None:
        raise ConfigError("negate=true needs a predicate", key=prefix + "negate")
    try:
        transform = t.cls(_parse_own(config, prefix, t.config_def), on_key=t.on_key)
    except ConfigError as exc:
        raise exc if (exc.key or "").startswith(prefix) else _reworded(exc, prefix) from None
    pred = predicates[pred_alias] if pred_alias is not None else None
    return Stage(alias, str(config[prefix + "type"]).strip(), transform, pred, pred_alias, bool(chain["negate"]))


def _declared(config: Mapping[str, Any], key: str) -> list[str]:
    aliases = _aliases(config, key)
    dupes = sorted({a for a in aliases if aliases.count(a) > 1})
    if dupes:
        raise ConfigError(f"alias {dupes[0]!r} is declared more than once", key=key)
    return aliases


def _stages(config: Mapping[str, Any], errors: list[ConfigError] | None) -> tuple[Stage, ...]:
    """Build every stage; with ``errors`` collect each problem and go on, else raise the first."""

    def attempt(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ConfigError as exc:
            if errors is None:
                raise
            errors.extend(exc.all if isinstance(exc, _UnknownKeys) else [exc])
            return None

    predicates: dict[str, Predicate | None] = {}
    for alias in attempt(lambda: _declared(config, "predicates")) or []:
        predicates[alias] = attempt(functools.partial(_predicate, config, alias))
    stages = []
    for alias in attempt(lambda: _declared(config, "transforms")) or []:
        stage = attempt(functools.partial(_stage, config, alias, predicates))
        if stage is not None:
            stages.append(stage)
    return tuple(stages)
