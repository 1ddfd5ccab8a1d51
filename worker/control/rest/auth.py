"""Optional REST authentication: HTTP basic (one user) or a bearer token, or both.

Configured on the worker with ``--rest-basic-auth USER:PASSWORD`` / ``EOSINK_REST_BASIC_AUTH`` and
``--rest-token TOKEN`` / ``EOSINK_REST_TOKEN``; the CLI reads the same variables, so one
environment serves both. A command line is visible to every user of the machine (``ps``), so each
credential can instead come from a file (``--rest-basic-auth-file`` / ``EOSINK_REST_BASIC_AUTH_FILE``,
``--rest-token-file`` / ``EOSINK_REST_TOKEN_FILE``: the first line) or from a config provider inside
the value (``USER:${file:/path/props:key}``, ``${env:VAR}``), resolved where it is used.
``/health`` and ``/ready`` stay open: container and Kubernetes probes carry no credentials.
Comparisons are constant-time.
"""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass
from pathlib import Path

from eosink.connectors.api.errors import ConfigError

OPEN_PATHS = frozenset({"/health", "/ready"})


@dataclass(frozen=True)
class CredentialNames:
    """How the settings are called where they are read, so an error names the one the user set."""

    basic: str
    basic_file: str
    token: str
    token_file: str


WORKER_NAMES = CredentialNames("--rest-basic-auth / EOSINK_REST_BASIC_AUTH", "--rest-basic-auth-file / EOSINK_REST_BASIC_AUTH_FILE",
                               "--rest-token / EOSINK_REST_TOKEN", "--rest-token-file / EOSINK_REST_TOKEN_FILE")
CLI_NAMES = CredentialNames("--basic-auth / EOSINK_REST_BASIC_AUTH", "--basic-auth-file / EOSINK_REST_BASIC_AUTH_FILE",
                            "--token / EOSINK_REST_TOKEN", "--token-file / EOSINK_REST_TOKEN_FILE")


def _first_line(path: str, setting: str) -> str:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", key=setting) from None
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    if not line:
        raise ConfigError(f"{path} is empty", key=setting)
    return line


def _resolve(value: str, setting: str) -> str:
    from eosink.worker.control.config import resolve_providers

    return str(resolve_providers(value, key=setting))


def _one(value: str | None, file: str | None, names: tuple[str, str]) -> str | None:
    """The credential from the value (providers resolved) or from the file; both given is an error."""
    if value and file:
        raise ConfigError(f"set either {names[0]} or {names[1]}, not both", key=names[1])
    if file:
        return _resolve(_first_line(file, names[1]), names[1])
    return _resolve(value, names[0]) if value else None


def credentials(basic: str | None, token: str | None, basic_file: str | None = None, token_file: str | None = None,
                names: CredentialNames = WORKER_NAMES) -> tuple[str | None, str | None]:
    """(``USER:PASSWORD`` or None, token or None) with files read and ``${env:}``/``${file:}`` resolved."""
    pair = _one(basic, basic_file, (names.basic, names.basic_file))
    if pair is not None:
        user, sep, _ = pair.partition(":")
        if not sep or not user:
            raise ConfigError("must be USER:PASSWORD", key=names.basic_file if basic_file else names.basic)
    return pair, _one(token, token_file, (names.token, names.token_file))


@dataclass(frozen=True)
class RestAuth:
    basic: tuple[str, str] | None = None
    token: str | None = None

    @classmethod
    def from_settings(cls, basic: str | None, token: str | None, basic_file: str | None = None,
                      token_file: str | None = None) -> RestAuth | None:
        pair_text, token = credentials(basic, token, basic_file, token_file)
        pair = None
        if pair_text:
            user, _, password = pair_text.partition(":")
            pair = (user, password)
        if pair is None and not token:
            return None
        return cls(pair, token or None)

    def secrets(self) -> list[str]:
        """What the redactor must hide: the password and the token."""
        return [s for s in (self.basic[1] if self.basic else None, self.token) if s]

    def challenge(self) -> str:
        return 'Basic realm="eosink"' if self.basic else 'Bearer realm="eosink"'

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.token:
            return hmac.compare_digest(value.encode(), self.token.encode())
        if scheme.lower() == "basic" and self.basic:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return hmac.compare_digest(user.encode(), self.basic[0].encode()) & hmac.compare_digest(
                password.encode(), self.basic[1].encode())
        return False


def client_header(basic: str | None, token: str | None) -> str | None:
    """The Authorization header the CLI sends for the same settings (already resolved: :func:`credentials`)."""
    if token:
        return f"Bearer {token}"
    if basic:
        return "Basic " + base64.b64encode(basic.encode()).decode()
    return None
