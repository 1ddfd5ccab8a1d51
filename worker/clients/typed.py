"""Typed command-line settings: every flag and its ``EOSINK_*`` variable parsed by one helper.

A bad value is one line naming the flag or the variable it came from, the value, and what is
accepted (``eosink: error: [cli] EOSINK_SESSION_TIMEOUT='ten': expected a duration ...``), exit code
2 as argparse has it - never a ``ValueError`` traceback. Variables are read when the subcommand
that uses them runs (argparse converts a string default only for the subcommand invoked), so a
worker's bad variable does not break ``eosink connectors list``.

Usage: ``setting(parser, "--rest-port", env="EOSINK_REST_PORT", kind=PORT, default="8083", help=...)``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

from eosink.connectors.api.errors import ConfigError, EosinkError


class BadSetting(ConfigError):
    """A flag or ``EOSINK_*`` variable with a value it does not accept."""

    def __init__(self, name: str, raw: str, accepts: str, secret: bool = False) -> None:
        shown = "[hidden]" if secret else repr(raw)  # a malformed credential is still a credential
        EosinkError.__init__(self, f"{name}={shown}: expected {accepts}", component="cli")
        self.key = name
        self.source = None


@dataclass(frozen=True)
class Kind:
    """How to read one kind of value: ``parse`` raises ValueError on a bad one; ``accepts`` says what is good."""

    parse: Callable[[str], Any]
    accepts: str
    secret: bool = False  # never echo the value in an error


def _duration(raw: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", raw)
    if not m:
        raise ValueError(raw)
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(raw)
    return value


def _int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw.strip())
        if not low <= value <= high:
            raise ValueError(raw)
        return value

    return parse


def _url(raw: str) -> str:
    if raw == "":
        return raw
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(raw)
    _ = parts.port  # raises ValueError for a port that is not a number in 0..65535
    return raw.strip().rstrip("/")


def _host_ports(raw: str) -> str:
    """``host:port[,host:port...]`` (Kafka bootstrap servers); empty = not given."""
    for item in filter(None, (s.strip() for s in raw.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(raw)
    return raw.strip()


def _zk_hosts(raw: str) -> str:
    """``host[:port][,host[:port]...][/chroot]`` (ZooKeeper's connect string); empty = not given."""
    hosts = raw.strip().split("/", 1)[0]
    for item in filter(None, (s.strip() for s in hosts.split(","))):
        host, sep, port = item.rpartition(":")
        if sep and (not host or not port.isdigit() or not 0 < int(port) < 65536):
            raise ValueError(raw)
    return raw.strip()


def _word(raw: str) -> str:
    if not raw.strip() or any(c.isspace() for c in raw.strip()):
        raise ValueError(raw)
    return raw.strip()


def _pair(sep: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        left, found, _ = raw.partition(sep)
        if not found or not left.strip():
            raise ValueError(raw)
        return raw

    return parse


def choice(*values: str) -> Kind:
    def parse(raw: str) -> str:
        if raw.strip().upper() not in {v.upper() for v in values}:
            raise ValueError(raw)
        return next(v for v in values if v.upper() == raw.strip().upper())

    return Kind(parse, "one of " + ", ".join(values))


DURATION = Kind(_duration, "a duration above 0: seconds (10, 2.5) or with a unit (500ms, 10s, 2m, 1h)")
PORT = Kind(_int_between(0, 65535), "a port number 0-65535 (0 = off)")
COUNT = Kind(_int_between(0, 2**31 - 1), "a whole number 0 or more")
URL = Kind(_url, "an http:// or https:// URL with a host (http://worker-1:8083)")
HOST_PORTS = Kind(_host_ports, "host:port[,host:port...]")
ZK_HOSTS = Kind(_zk_hosts, "host[:port][,host[:port]...][/chroot]")
WORD = Kind(_word, "a non-empty value without spaces")
HOST = Kind(_word, "a host name or address (0.0.0.0 = every interface)")
USER_PASSWORD = Kind(_pair(":"), "USER:PASSWORD", secret=True)
KEY_VALUE = Kind(_pair("="), "KEY=VALUE")
TEXT = Kind(str, "any text")
LOG_LEVEL = choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _FromEnv(str):
    """A default taken from an environment variable: a bad one is reported under the variable's name."""

    env: str


def read(kind: Kind, raw: str, name: str) -> Any:
    """``raw`` as ``kind``, or :class:`BadSetting` naming ``name`` (a flag or a variable)."""
    try:
        return kind.parse(raw)
    except (ValueError, TypeError):
        raise BadSetting(name, raw, kind.accepts, kind.secret) from None


def env(name: str, kind: Kind, default: Any = None) -> Any:
    """The variable ``name`` as ``kind`` (``default`` when unset or empty)."""
    raw = os.environ.get(name)
    return default if raw in (None, "") else read(kind, raw, name)


def setting(parser: argparse.ArgumentParser, flag: str, *, kind: Kind, env: str | None = None, default: str | None = None,
            **kw: Any) -> argparse.Action:
    """A flag whose value - given, or else from ``env``, or else ``default`` - is read as ``kind``."""
    raw = os.environ.get(env) if env else None
    if raw not in (None, ""):
        value: Any = _FromEnv(raw)
        value.env = env
    else:
        value = default

    def convert(given: str) -> Any:
        return read(kind, given, given.env if isinstance(given, _FromEnv) else flag)

    convert.__name__ = kind.accepts  # argparse names the type in its own messages
    if env and "help" in kw and env not in kw["help"]:
        kw["help"] = f"{kw['help']} ({env})"
    return parser.add_argument(flag, type=convert, default=value, **kw)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (exit 2), pointing at ``--help`` for the usage."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


__all__ = ["COUNT", "DURATION", "HOST", "HOST_PORTS", "KEY_VALUE", "LOG_LEVEL", "PORT", "TEXT", "URL", "USER_PASSWORD",
           "WORD", "ZK_HOSTS", "BadSetting", "Kind", "OneLineParser", "choice", "env", "read", "setting"]
