"""The Schema Registry locked down: TLS with the stack's certificate, HTTP basic auth on every API path,
and its storage a PostgreSQL role of its own, over TLS.

Apicurio Registry 3.3.3's own authentication is OIDC only (it needs an identity server this stack
does not run). Its Quarkus HTTP layer, though, can demand credentials itself: the app ships
Quarkus' embedded user realm (``quarkus.security.users.embedded``) and honours runtime HTTP
permissions, so one policy, ``authenticated`` on ``/*``, covers every path the app serves (the
Confluent API, Apicurio's own v2/v3 API, anything else). The plain HTTP listener is switched off
(``quarkus.http.insecure-requests=disabled``): there is no port without TLS.

What was tried and does not work on 3.3.3, so it is not used:

- a Unix domain socket (``quarkus.http.domain-socket``) behind an authenticating front: Vert.x
  needs netty's native epoll transport for it, which the app does not ship ("Unable to bind to
  Unix domain socket. Consider adding the 'io.netty:netty-transport-native-epoll' dependency");
- credentials or client certificates on the management interface (health, metrics):
  ``quarkus.management.auth.enabled`` and ``quarkus.management.ssl.client-auth`` are fixed at the
  app's build time (to off). The management interface therefore serves ``/health`` and
  ``/metrics`` over TLS on loopback without credentials; no schema and no API is reachable there.

Secrets never appear on the command line (``/proc/<pid>/cmdline`` is readable by every local user):
the basic-auth user and the database password go into ``registry.properties`` in the stack's
secrets directory (0600), which Quarkus reads through ``quarkus.config.locations``.
"""

from __future__ import annotations

import base64
import ssl
import urllib.request
from pathlib import Path

from eosink.worker.stack.layout import HOST
from eosink.worker.stack.secure import USERS, Material, secret_key, write_private

#: The basic-auth principal every registry client (worker, publisher, the stack itself) uses.
CLIENT_ROLE = "registry"
#: The PostgreSQL role the registry stores its schemas as: owns schema ``eosink_registry`` in its database.
STORAGE_ROLE = "postgres.registry"
CONFIG_FILE = "registry.properties"


def config_file(m: Material) -> Path:
    return m.directory / CONFIG_FILE


def write_config(m: Material) -> Path:
    """``registry.properties`` (0600): the embedded user realm and the storage password, rewritten every start."""
    lines = [
        "# Written by `eosink stack up --secure` on every start; edits are lost.",
        "quarkus.security.users.embedded.enabled=true",
        "quarkus.security.users.embedded.plain-text=true",
        f'quarkus.security.users.embedded.users."{USERS[CLIENT_ROLE]}"={_escape(m.password(CLIENT_ROLE))}',
        f"apicurio.datasource.password={_escape(m.password(STORAGE_ROLE))}",
    ]
    path = config_file(m)
    write_private(path, ("\n".join(lines) + "\n").encode())
    return path


def _escape(value: str) -> str:
    """A properties value read back verbatim (generated passwords are URL-safe; this guards the rest)."""
    return value.replace("\\", "\\\\")


def jdbc_url(m: Material, pg_port: int, database: str) -> str:
    """pgjdbc over TLS, the server verified against the stack's CA and its name (``verify-full``)."""
    return f"jdbc:postgresql://{HOST}:{pg_port}/{database}?sslmode=verify-full&sslrootcert={m.ca_cert}"


def server_flags(m: Material, port: int, management_port: int) -> list[str]:
    """The ``-D`` flags of a locked-down registry (none carries a secret)."""
    cert, key = m.server_cert, m.server_key
    return [
        f"-Dquarkus.config.locations={config_file(m)}",
        f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.ssl-port={port}", f"-Dquarkus.http.port={port}",
        "-Dquarkus.http.insecure-requests=disabled",
        f"-Dquarkus.tls.key-store.pem.0.cert={cert}", f"-Dquarkus.tls.key-store.pem.0.key={key}",
        "-Dquarkus.http.auth.basic=true",
        "-Dquarkus.http.auth.permission.everything.paths=/*",
        "-Dquarkus.http.auth.permission.everything.policy=authenticated",
        f"-Dquarkus.management.host={HOST}", f"-Dquarkus.management.port={management_port}",
        f"-Dquarkus.management.ssl.certificate.files={cert}", f"-Dquarkus.management.ssl.certificate.key-files={key}",
    ]


def storage_env(m: Material, pg_port: int, database: str) -> dict[str, str]:
    """Apicurio's storage settings: the registry's own role over TLS (its password is in :func:`config_file`)."""
    return {"APICURIO_DATASOURCE_URL": jdbc_url(m, pg_port, database),
            "APICURIO_DATASOURCE_USERNAME": USERS[STORAGE_ROLE]}


def client_context(m: Material) -> ssl.SSLContext:
    """A TLS context that trusts the stack's CA alone."""
    return ssl.create_default_context(cafile=str(m.ca_cert))


def auth_header(m: Material) -> dict[str, str]:
    """``Authorization: Basic ...`` of the registry's client principal."""
    token = base64.b64encode(f"{USERS[CLIENT_ROLE]}:{m.password(CLIENT_ROLE)}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def open_url(m: Material, request: urllib.request.Request, timeout: float) -> bytes:
    """Send ``request`` to the secure registry with TLS and the client's credentials; the answer's body."""
    for name, value in auth_header(m).items():
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=timeout, context=client_context(m)) as answer:  # noqa: S310 - https only
        return bytes(answer.read())


def endpoint(m: Material, url: str, health_url: str) -> dict[str, object]:
    """endpoints.json's ``registry`` entry: where it is, whom to trust, whose credentials (a reference, never
    the password), and the converter keys a connector config takes as they are."""
    user_info = f"{USERS[CLIENT_ROLE]}:{m.reference(CLIENT_ROLE)}"
    return {
        "url": url, "health_url": health_url, "ca_file": str(m.ca_cert), "user": USERS[CLIENT_ROLE],
        "credentials_file": str(m.credentials_file), "password_key": secret_key(CLIENT_ROLE),
        "converter": {"schema.registry.url": url, "schema.registry.ssl.ca.location": str(m.ca_cert),
                      "basic.auth.credentials.source": "USER_INFO", "basic.auth.user.info": user_info},
    }
