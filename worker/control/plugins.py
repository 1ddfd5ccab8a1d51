"""Connector plugins and their declared configuration: the validate endpoint and the generated docs.

One source of truth: each sink class's ``CONFIG`` (a :class:`~eosink.connectors.api.config.ConfigDef`) plus
the engine's :data:`eosink.worker.control.config.COMMON` keys. The same declarations drive registration
(:func:`eosink.worker.control.config.parse_connector`), ``PUT /connector-plugins/{p}/config/validate`` (Kafka
Connect's ``ConfigInfos`` shape: every key, its value and its errors) and the generated reference pages
(:mod:`eosink.worker.control.config_docs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.config import MASK, ConfigDef, ConfigKey, Importance, Type
from eosink.connectors.api.errors import ConfigError
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker.control.config import _REF, ALIASES, COMMON, CONNECTOR_NAME, FANOUT, load_class, parse_connector
from eosink.worker.version import VERSION

_ERROR_KEYS = frozenset(k for k in COMMON.keys if k.startswith("errors."))
NAME_KEY = ConfigKey("name", Type.STRING, doc="Globally unique name of the connector (names znodes, tables and "
                     "transaction ids): 1-100 letters, digits, '_' or '-'.", importance=Importance.HIGH)


@dataclass(frozen=True)
class Plugin:
    alias: str
    class_name: str
    cls: type[TwoPhaseCommitSink] | None  # None for fanout

    def info(self) -> dict[str, str]:
        return {"class": self.class_name, "type": "sink", "version": VERSION}


def plugins() -> list[Plugin]:
    """Every connector class that can be loaded here (a connector module missing from this build is left out)."""
    out = []
    for alias, path in sorted(ALIASES.items()):
        try:
            out.append(Plugin(alias, path, load_class(alias)))
        except ConfigError:
            continue
    out.append(Plugin(FANOUT, FANOUT, None))
    return out


def find(name: str) -> Plugin | None:
    """By alias (``postgres``), dotted class path, or simple class name (``PostgresSink``, ``Postgres``)."""
    low = name.lower()
    if low == FANOUT:
        return Plugin(FANOUT, FANOUT, None)
    if low in ALIASES:  # the usual registration: load that one class, not every connector's dependencies
        try:
            return Plugin(low, ALIASES[low], load_class(low))
        except ConfigError:
            return None
    for p in plugins():
        simple = p.class_name.rsplit(".", 1)[-1].lower()
        if low in (p.alias.lower(), p.class_name.lower(), simple, simple.removesuffix("sink")):
            return p
    if "." in name:
        try:
            return Plugin(name, name, load_class(name))
        except ConfigError:
            return None
    return None


def key_groups(plugin: Plugin, config: Mapping[str, Any]) -> list[tuple[str, str, ConfigDef]]:
    """(group, key prefix, definition) for every group of keys ``plugin`` reads."""
    common = ConfigDef({k: v for k, v in COMMON.keys.items() if k not in _ERROR_KEYS})
    errors = ConfigDef({k: v for k, v in COMMON.keys.items() if k in _ERROR_KEYS})
    out = [("Common", "", ConfigDef({"name": NAME_KEY, **common.keys})), ("Error Handling", "", errors)]
    if plugin.cls is not None:
        out.append((plugin.alias or plugin.class_name, "", plugin.cls.CONFIG))
        return out
    sinks_def = ConfigDef().define("sinks", Type.LIST, doc="Names of the sinks of a fanout connector, comma-separated; "
                                   "each is configured under sinks.<name>.*", importance=Importance.HIGH)
    out.append(("Fanout", "", sinks_def))
    try:
        aliases = sinks_def.parse(config)["sinks"]
    except ConfigError:
        return out
    for alias in aliases:
        prefix = f"sinks.{alias}."
        sub = ConfigDef().define("connector.class", Type.STRING, doc=f"Class of sink {alias}.", importance=Importance.HIGH)
        try:
            cls = load_class(str(config.get(prefix + "connector.class", "")))
            sub = sub.extend(cls.CONFIG)
        except ConfigError:
            pass
        out.append((f"sinks.{alias}", prefix, sub))
    return out


def display_value(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


def validate(plugin: Plugin, config: Mapping[str, Any]) -> dict[str, Any]:
    """Kafka Connect's ``ConfigInfos``: every declared key with its value and errors, ``error_count``.

    ``${env:..}``/``${file:..}`` values are not checked (only the worker running the connector can
    resolve them). Cross-key rules (``errors.tolerance=all`` needs a topic, ``insert.mode=upsert``
    needs ``pk.mode``...) are found by registering it for real, and reported on their key."""
    configs: list[dict[str, Any]] = []
    groups: list[str] = []
    errors_by_key: dict[str, list[str]] = {}
    order = 0
    for group, prefix, cdef in key_groups(plugin, config):
        groups.append(group)
        sub = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
        for key in cdef.keys.values():
            full = prefix + key.name
            value = config.get(full)
            errors: list[str] = []
            if not (isinstance(value, str) and _REF.search(value)):
                try:
                    ConfigDef._parse_one(key, sub)
                    if key is NAME_KEY and not CONNECTOR_NAME.match(str(value or "")):
                        errors.append("must be 1-100 letters, digits, '_' or '-'")
                except ConfigError as exc:
                    errors.append(exc.message.split(": ", 1)[-1])
            errors_by_key[full] = errors
            order += 1
            shown = MASK if key.type is Type.PASSWORD and value not in (None, "") else display_value(value)
            configs.append({
                "definition": {"name": full, "type": key.type.value, "required": key.required,
                               "default_value": None if key.required else display_value(key.default), "importance": key.importance.value,
                               "documentation": key.doc, "group": group, "width": "NONE", "display_name": full,
                               "dependents": [], "order": order},
                "value": {"name": full, "value": shown, "recommended_values": [], "errors": errors, "visible": True},
            })
    if not any(errors_by_key.values()):
        problem = registration_error(config.get("name") or "validate", config, plugin)
        if problem is not None:
            culprit = problem.key or "connector.class"
            if culprit not in errors_by_key:
                errors_by_key[culprit] = []  # the entry's list itself, so the error below shows in it
                configs.append({"definition": {"name": culprit, "type": "STRING", "required": False, "default_value": None,
                                               "importance": "HIGH", "documentation": "", "group": "Common", "width": "NONE",
                                               "display_name": culprit, "dependents": [], "order": order + 1},
                                "value": {"name": culprit, "value": display_value(config.get(culprit)), "recommended_values": [],
                                          "errors": errors_by_key[culprit], "visible": True}})
            errors_by_key[culprit].append(problem.message.split(": ", 1)[-1])
    return {"name": plugin.class_name, "error_count": sum(len(e) for e in errors_by_key.values()), "groups": groups,
            "configs": configs}


def registration_error(name: Any, config: Mapping[str, Any], plugin: Plugin | None = None) -> ConfigError | None:
    """The first problem registering ``config`` would meet, or None: the declared keys, then what each
    sink's constructor checks across keys (skipped while values are unresolved references)."""
    cfg = dict(config)
    if plugin is not None:
        cfg.setdefault("connector.class", plugin.alias if plugin.cls is None or plugin.alias in ALIASES else plugin.class_name)
    try:
        parsed = parse_connector(name, cfg, resolve=False, check_clients=True)
        if not any(isinstance(v, str) and _REF.search(v) for v in parsed.raw.values()):
            parsed.create_sinks()  # constructors check cross-key rules; they connect to nothing
    except ConfigError as exc:
        return exc
    except Exception:  # noqa: BLE001 - a constructor that needs more than the config: checked when it starts
        return None
    return None


def errors_message(infos: dict[str, Any], plugin_name: str) -> str:
    """Kafka Connect's 400 message for an invalid configuration, naming every key."""
    lines = [f"{c['value']['name']}: {e}" for c in infos["configs"] for e in c["value"]["errors"]]
    return (f"Connector configuration is invalid and contains the following {len(lines)} error(s):\n" + "\n".join(lines)
            + f"\nYou can also find the above list of errors at the endpoint "
              f"`/connector-plugins/{plugin_name}/config/validate`")


def config_keys(plugin: Plugin) -> list[dict[str, Any]]:
    """``GET /connector-plugins/{p}/config``: Kafka Connect's ConfigKeyInfo list."""
    out: list[dict[str, Any]] = []
    for group, prefix, cdef in key_groups(plugin, {}):
        for key in cdef.keys.values():
            out.append({"name": prefix + key.name, "type": key.type.value, "required": key.required,
                        "default_value": None if key.required else display_value(key.default), "importance": key.importance.value,
                        "documentation": key.doc, "group": group, "width": "NONE", "display_name": prefix + key.name,
                        "dependents": [], "order": len(out) + 1})
    return out
