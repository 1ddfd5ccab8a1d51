"""Optional REST authentication: HTTP basic (one user) or a bearer token, or both.

Configured on the worker with ``--rest-basic-auth USER:PASSWORD`` / ``EOSINK_REST_BASIC_AUTH`` and
``--rest-token TOKEN`` / ``EOSINK_REST_TOKEN``; the CLI reads the same variables, so one
environment serves both. ``/health`` and ``/ready`` stay open: container and Kubernetes probes
carry no credentials. Comparisons are constant-time.
"""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass

from eosink.connectors.api.errors import ConfigError

OPEN_PATHS = frozenset({"/health", "/ready"})


@dataclass(frozen=True)
class RestAuth:
    basic: tuple[str, str] | None = None
    token: str | None = None

    @classmethod
    def from_settings(cls, basic: str | None, token: str | None) -> RestAuth | None:
        pair = None
        if basic:
            user, sep, password = basic.partition(":")
            if not sep or not user:
                raise ConfigError("must be USER:PASSWORD", key="--rest-basic-auth / EOSINK_REST_BASIC_AUTH")
            pair = (user, password)
        if pair is None and not token:
            return None
        return cls(pair, token or None)

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
    """The Authorization header the CLI sends for the same settings."""
    if token:
        return f"Bearer {token}"
    if basic:
        return "Basic " + base64.b64encode(basic.encode()).decode()
    return None
