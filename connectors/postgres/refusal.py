"""Why PostgreSQL refused a connection, as one line naming the setting to fix.

libpq reports a refused connection as text only - no SQLSTATE reaches the client before the
session exists - and a retry would not fix any of these: a wrong password, a certificate the
client does not trust, a server that accepts TLS connections only. Each becomes a
:class:`FatalError` naming the ``connection.*`` key (or the DSN parameter) to change; anything
else (a server down, a network cut) stays retryable.

A server that is full (SQLSTATE 53300: ``max_connections``, the reserved slots, a role's or a
database's CONNECTION LIMIT) is retryable: connections free up as other clients end.
:func:`server_full` names the limit and :func:`limits` reads its value for the error's message.

The untrusted certificate is established by a TLS handshake of our own (PostgreSQL's SSLRequest,
then the handshake against ``sslrootcert``), which also yields the precise reason (expired,
self-signed, wrong host) instead of libpq's generic text. Password and TLS-only refusals are
told apart by the server's FATAL message, the one thing libpq hands over for them.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

from eosink.connectors.api.errors import FatalError

COMPONENT = "postgres"
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_VERIFYING = ("verify-ca", "verify-full")


def _root_cert(params: dict[str, Any]) -> str | None:
    """``sslrootcert`` as libpq resolves it (``~/.postgresql/root.crt`` by default)."""
    given = params.get("sslrootcert") or os.environ.get("PGSSLROOTCERT")
    if given:
        return str(given)
    default = Path.home() / ".postgresql" / "root.crt"
    return str(default) if default.exists() else None


def untrusted_certificate(host: str, port: int, cafile: str | None, check_hostname: bool, timeout_s: float = 5.0) -> str | None:
    """Why the server's certificate fails verification against ``cafile``, or None when it passes
    (or the probe cannot tell: no TLS offered, server unreachable)."""
    ctx = ssl.create_default_context() if cafile == "system" else ssl.create_default_context(cafile=cafile)
    ctx.check_hostname = check_hostname
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(_SSL_REQUEST)
            if sock.recv(1) != b"S":
                return None
            try:
                ctx.wrap_socket(sock, server_hostname=host).close()
            except ssl.SSLCertVerificationError as exc:
                return str(exc.verify_message or exc)
    except (ssl.SSLError, OSError):
        return None
    return None


def classify(text: str, params: dict[str, Any], connector: str) -> FatalError | None:
    """A FatalError for a refusal no retry fixes, else None. ``params``: the DSN's and the overrides."""
    host, port = str(params.get("host") or "localhost"), int(params.get("port") or 5432)
    where = f"PostgreSQL at {host}:{port}/{params.get('dbname') or params.get('user') or ''}"
    src = f"connector '{connector}'"
    mode = str(params.get("sslmode") or os.environ.get("PGSSLMODE") or "prefer")
    if mode in _VERIFYING and not host.startswith("/"):
        root = _root_cert(params)
        if root is None:
            return FatalError(f"{src}: sslmode={mode} needs the CA that signed the server's certificate: set sslrootcert=<CA "
                              "file> in connection.url", component=COMPONENT)
        if root != "system" and not Path(root).is_file():
            return FatalError(f"{src}: sslrootcert={root} (connection.url) is not a readable file", component=COMPONENT)
        why = untrusted_certificate(host, port, root, check_hostname=mode == "verify-full")
        if why is not None:
            return FatalError(f"{src}: TLS: the certificate of {where} is not trusted ({why}); check sslrootcert in "
                              f"connection.url (now {root})", component=COMPONENT)
    user = params.get("user") or "(default user)"
    if "password authentication failed" in text or "no password supplied" in text:
        return FatalError(f"{src}: {where} refused user {user}: password authentication failed (check connection.user / "
                          "connection.password)", component=COMPONENT)
    if "no encryption" in text:
        return FatalError(f"{src}: {where} accepts TLS connections only (pg_hba.conf): set sslmode=verify-full and "
                          f"sslrootcert=<CA file> in connection.url (now sslmode={mode})", component=COMPONENT)
    return None


#: The server's FATAL texts for SQLSTATE 53300 (too_many_connections), and what sets each limit.
_FULL = (
    ("too many clients already", "max_connections"),
    ("remaining connection slots are reserved", "max_connections minus the reserved slots"),
    ("too many connections for role", "the role's CONNECTION LIMIT"),
    ("too many connections for database", "the database's CONNECTION LIMIT"),
)


def server_full(text: str, sqlstate: str | None) -> str | None:
    """Which limit refused a connection when the server is full (SQLSTATE 53300), else None."""
    for words, limit in _FULL:
        if words in text:
            return limit
    return "max_connections" if sqlstate == "53300" else None


def limits(conn: Any) -> str | None:
    """``max_connections=N`` with the reserved slots and the client connections in use, read on
    ``conn`` (an open autocommit connection to the same server); None when it cannot be read."""
    try:
        row = conn.execute(
            "SELECT current_setting('max_connections'), current_setting('superuser_reserved_connections'),"
            " coalesce(current_setting('reserved_connections', true), '0'),"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),"
            " (SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'eosink/%')").fetchone()
    except Exception:  # noqa: BLE001 - the limit is a detail of the message, not worth a failure
        return None
    if row is None:
        return None
    total, superuser, reserved, used, ours = row
    return (f"max_connections={total} (superuser_reserved_connections={superuser}, reserved_connections={reserved}; "
            f"{used} client connections open, {ours} of them eosink sinks)")
