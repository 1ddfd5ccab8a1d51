"""Declared configuration, in the spirit of Kafka Connect's ``ConfigDef``.

Each connector declares its keys (name, type, default, validator, importance, documentation);
the declaration drives parsing, validation (errors name the key), masking of passwords and
generated docs. Values arrive as JSON, where Kafka Connect users habitually write every value
as a string (``"tasks.max": "1"``), so strings are coerced to the declared type.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eosink.connectors.api.errors import ConfigError

_REQUIRED = object()
MASK = "[hidden]"


class Type(enum.Enum):
    STRING = "STRING"
    INT = "INT"
    LONG = "LONG"
    DOUBLE = "DOUBLE"
    BOOLEAN = "BOOLEAN"
    LIST = "LIST"
    PASSWORD = "PASSWORD"


class Importance(enum.Enum):
    HIGH = "HIGH"
    MEDIUM = "MEDIUM"
    LOW = "LOW"


Validator = Callable[[str, Any], None]


def one_of(*choices: str) -> Validator:
    def check(key: str, value: Any) -> None:
        if value not in choices:
            raise ConfigError(f"must be one of {', '.join(choices)}, got {value!r}", key=key)

    return check


def at_least(minimum: float) -> Validator:
    def check(key: str, value: Any) -> None:
        if value is not None and value < minimum:
            raise ConfigError(f"must be >= {minimum}, got {value!r}", key=key)

    return check


def non_empty(key: str, value: Any) -> None:
    if value is None or value == "" or value == []:
        raise ConfigError("must not be empty", key=key)


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: Type
    default: Any = _REQUIRED
    doc: str = ""
    importance: Importance = Importance.MEDIUM
    validator: Validator | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def coerce(self, raw: Any) -> Any:
        t = self.type
        try:
            if raw is None:
                return None
            if t in (Type.STRING, Type.PASSWORD):
                if isinstance(raw, (dict, list)):
                    raise ValueError("expected a string")
                return str(raw)
            if t in (Type.INT, Type.LONG):
                if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                    raise ValueError("expected an integer")
                return int(str(raw).strip()) if not isinstance(raw, (int, float)) else int(raw)
            if t is Type.DOUBLE:
                if isinstance(raw, bool):
                    raise ValueError("expected a number")
                return float(raw)
            if t is Type.BOOLEAN:
                if isinstance(raw, bool):
                    return raw
                s = str(raw).strip().lower()
                if s in ("true", "false"):
                    return s == "true"
                raise ValueError("expected true or false")
            if t is Type.LIST:
                if isinstance(raw, list):
                    return [str(x).strip() for x in raw if str(x).strip()]
                return [s.strip() for s in str(raw).split(",") if s.strip()]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{exc} of type {t.value}, got {raw!r}", key=self.name) from None
        raise AssertionError(t)


@dataclass
class ConfigDef:
    keys: dict[str, ConfigKey] = field(default_factory=dict)

    def define(
        self,
        name: str,
        type: Type,  # noqa: A002 - Kafka Connect's ConfigDef.define(name, type, ...): a keyword callers may use
        default: Any = _REQUIRED,
        doc: str = "",
        importance: Importance = Importance.MEDIUM,
        validator: Validator | None = None,
    ) -> ConfigDef:
        self.keys[name] = ConfigKey(name, type, default, doc, importance, validator)
        return self

    def extend(self, other: ConfigDef) -> ConfigDef:
        """A new definition with ``other``'s keys added (a connector on top of the common keys)."""
        return ConfigDef({**self.keys, **other.keys})

    def validate(self, config: Mapping[str, Any]) -> dict[str, list[str]]:
        """Every key's errors at once (the validate endpoint's view); empty lists when fine."""
        errors: dict[str, list[str]] = {}
        for key in self.keys.values():
            try:
                self._parse_one(key, config)
                errors[key.name] = []
            except ConfigError as exc:
                errors[key.name] = [exc.message.split(": ", 1)[-1]]
        return errors

    def parse(self, config: Mapping[str, Any], *, source: str | None = None, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Coerce and validate ``config``; unknown keys pass through untouched (as in Connect).

        Keys in ``skip`` are kept as given (values that are still config-provider references,
        which only the worker that runs the connector can resolve).
        """
        out = dict(config)
        for key in self.keys.values():
            if key.name in skip:
                continue
            try:
                out[key.name] = self._parse_one(key, config)
            except ConfigError as exc:
                raise ConfigError(exc.message.split(": ", 1)[-1], key=key.name, source=source) from None
        return out

    @staticmethod
    def _parse_one(key: ConfigKey, config: Mapping[str, Any]) -> Any:
        if key.name not in config or config[key.name] in (None, ""):
            if key.required:
                raise ConfigError("is required and has no default", key=key.name)
            return key.default
        value = key.coerce(config[key.name])
        if key.validator is not None:
            key.validator(key.name, value)
        return value

    def passwords(self) -> Iterable[str]:
        return (k.name for k in self.keys.values() if k.type is Type.PASSWORD)

    def mask(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with every password-typed value replaced, for responses and log lines."""
        secret = set(self.passwords())
        return {k: (MASK if k in secret and v not in (None, "") else v) for k, v in config.items()}
