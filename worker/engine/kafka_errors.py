"""Kafka's refusals as eosink errors: authorization, authentication and TLS failures are fatal, in one line.

Against a locked-down broker a missing ACL, a wrong password or a wrong CA is not transient:
retrying it forever only hides it. librdkafka reports the three differently, and this module turns
each into one :class:`FatalError` subclass whose message names the librdkafka error, the principal,
the operation and the resource (or the setting to check), and never a secret:

- an ACL refusal is an error *code* on the failing call or record (``TOPIC_AUTHORIZATION_FAILED``,
  ``GROUP_AUTHORIZATION_FAILED``, ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, ...):
  :func:`authorization_error`;
- a refused SASL login or TLS handshake is reported only to the client's ``error_cb`` (``_AUTHENTICATION``,
  ``_SSL``); the call itself just times out (``_TRANSPORT``): :class:`ConnectionWatch` is that
  callback, and :meth:`ConnectionWatch.check` raises what it saw.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from eosink.connectors.api.errors import FatalError

#: librdkafka error name -> the resource kind its ACL names (``KafkaError.name()`` is stable; codes are too).
AUTHORIZATION_ERRORS: dict[str, str] = {
    "TOPIC_AUTHORIZATION_FAILED": "topic",
    "GROUP_AUTHORIZATION_FAILED": "group",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional.id",
    "CLUSTER_AUTHORIZATION_FAILED": "cluster",
    "DELEGATION_TOKEN_AUTHORIZATION_FAILED": "delegation token",
}


class KafkaAuthorizationError(FatalError):
    """The broker's ACLs do not allow ``principal`` to ``operation`` the resource: an operator must grant it."""

    def __init__(self, code: str, principal: str, operation: str, resource_type: str, resource: str, *,
                 component: str, detail: str = "") -> None:
        super().__init__(f"{code}: {principal} may not {operation} {resource_type} {resource}"
                         + (f" ({detail})" if detail else ""), component=component)
        self.code = code
        self.principal = principal
        self.operation = operation
        self.resource_type = resource_type
        self.resource = resource


class KafkaAuthenticationError(FatalError):
    """The broker refused the SASL login: wrong user name, password or mechanism."""


class KafkaTlsError(FatalError):
    """The TLS handshake failed: the broker's certificate is not trusted by ``ssl.ca.location`` (or no TLS)."""


def principal(settings: Mapping[str, Any]) -> str:
    """Who the client is, for messages: its SASL user name, else ``ANONYMOUS`` (never a password)."""
    return str(settings.get("sasl.username") or "ANONYMOUS")


def is_authorization(err: Any) -> bool:
    """True when ``err`` (a ``KafkaError``) is an ACL refusal."""
    return err is not None and err.name() in AUTHORIZATION_ERRORS


def authorization_error(err: Any, settings: Mapping[str, Any], operation: str, resource: str, *, component: str,
                        resource_type: str | None = None, detail: str = "",
                        cls: type[KafkaAuthorizationError] = KafkaAuthorizationError) -> KafkaAuthorizationError | None:
    """``cls`` (:class:`KafkaAuthorizationError`) for ``err`` when it is an ACL refusal, else ``None`` (classify it otherwise).

    ``resource_type`` defaults to the kind the error code names; ``resource`` is the name (or prefix) refused.
    """
    if not is_authorization(err):
        return None
    kind = resource_type or AUTHORIZATION_ERRORS[err.name()]
    return cls(err.name(), principal(settings), operation, kind, resource, component=component, detail=detail)


class ConnectionWatch:
    """A librdkafka ``error_cb`` that remembers the first authentication or TLS failure.

    librdkafka reports a refused login or handshake only here; the request that needed the connection
    merely times out. Callbacks are served by ``poll``/``consume``/``flush`` (admin clients: ``poll``),
    so :meth:`check` polls the client once before looking.
    """

    def __init__(self, settings: Mapping[str, Any], component: str,
                 authentication: type[KafkaAuthenticationError] = KafkaAuthenticationError,
                 tls: type[KafkaTlsError] = KafkaTlsError) -> None:
        self.settings = {k: v for k, v in settings.items() if k != "error_cb"}
        self.component = component
        self._classes = (authentication, tls)
        self._lock = threading.Lock()
        self._seen: FatalError | None = None

    def __call__(self, err: Any) -> None:
        name = err.name()
        if name not in ("_AUTHENTICATION", "_SSL"):
            return
        with self._lock:
            if self._seen is None:
                self._seen = self._error(name)

    def _error(self, name: str) -> FatalError:
        where = self.settings.get("bootstrap.servers", "?")
        if name == "_AUTHENTICATION":
            return self._classes[0](
                f"SASL authentication failed for user {principal(self.settings)} at {where} with mechanism "
                f"{self.settings.get('sasl.mechanism', 'GSSAPI')} (check sasl.username / sasl.password / sasl.mechanism)",
                component=self.component)
        return self._classes[1](
            f"TLS handshake with {where} failed: the broker's certificate is not trusted "
            f"(check ssl.ca.location={self.settings.get('ssl.ca.location', '(system default)')} and security.protocol)",
            component=self.component)

    def install(self, conf: dict[str, Any]) -> dict[str, Any]:
        """``conf`` with this watch as its ``error_cb`` (a caller's own ``error_cb`` is kept: it wins)."""
        conf.setdefault("error_cb", self)
        return conf

    @property
    def seen(self) -> FatalError | None:
        with self._lock:
            return self._seen

    def check(self, client: Any = None) -> None:
        """Raise the failure seen so far, if any, after serving the pending callbacks of ``client``: an admin
        client or a producer only (a consumer's ``poll`` would take a record; ``consume`` serves them anyway)."""
        if client is not None and self._seen is None:
            try:
                client.poll(0)
            except Exception:  # noqa: BLE001 - a closed client: nothing more to serve
                pass
        seen = self.seen
        if seen is not None:
            raise seen
