"""PostgreSQL locked down: TLS, scram-sha-256 only, and a sink role that owns its schema and nothing else.

What the secure stack's PostgreSQL enforces, and why each piece is there:

- ``hostssl ... scram-sha-256`` for TCP and ``hostnossl ... reject``: a password never crosses the
  wire in clear, and a plain connection is refused by name ("no encryption") instead of by silence;
- the unix socket: ``peer`` for the OS account that runs the server, mapped to the admin role, and
  nobody else. That account owns the data files, so a password would protect nothing from it;
  every other local user is refused (the socket directory is 0700 besides);
- the admin role ``eosink`` (the cluster's superuser, made by initdb) has a password from the first
  start (``initdb --pwfile``): the server never runs with ``trust``;
- the sink role ``eosink_sink``: LOGIN, no SUPERUSER / CREATEDB / CREATEROLE / REPLICATION /
  BYPASSRLS; CONNECT on the stack's database; owner of schema ``eosink_sink``, which is its
  ``search_path``, so the sink's bookkeeping tables and auto-created targets land there. PUBLIC
  loses CONNECT on the databases and every right on schema ``public``: the sink can reach its own
  schema and the catalogs, nothing else. Two-phase commit needs no grant: a role may PREPARE,
  COMMIT PREPARED and ROLLBACK PREPARED its own transactions, and ``pg_prepared_xacts`` is readable
  by all (it lists GIDs and owners, never data).

Role passwords are sent to the server as SCRAM verifiers computed here, never in clear: a
statement that fails is echoed into the server log, and a verifier there reveals no password.
Clients read passwords from a pgpass file in the secrets dir (libpq ``passfile=``), so a DSN that
endpoints.json, a config or an error message shows carries none.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path
from urllib.parse import quote

from eosink.worker.stack.layout import HOST
from eosink.worker.stack.secure import USERS, Material, write_private

ADMIN_PASSWORD_ROLE = "postgres.admin"
SINK_PASSWORD_ROLE = "postgres.sink"
ADMIN_ROLE = USERS[ADMIN_PASSWORD_ROLE]
SINK_ROLE = USERS[SINK_PASSWORD_ROLE]
#: The sink role's own schema (its search_path): named as the role, as PostgreSQL's ``"$user"`` convention.
SINK_SCHEMA = SINK_ROLE
CERT_FILE = "server.crt"
KEY_FILE = "server.key"
HBA_FILE = "pg_hba.conf"
IDENT_FILE = "pg_ident.conf"
IDENT_MAP = "eosink_server"
PASSFILE = "pgpass"
SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations


def server_settings() -> list[str]:
    """Lines for ``eosink.conf``: TLS on with the stack's certificate, SCRAM for every password."""
    return [
        "ssl = on",
        f"ssl_cert_file = '{CERT_FILE}'",  # relative to the data directory, where the component copies them
        f"ssl_key_file = '{KEY_FILE}'",
        "ssl_min_protocol_version = 'TLSv1.2'",
        "password_encryption = 'scram-sha-256'",
    ]


def hba() -> str:
    """pg_hba.conf: the first matching line decides, and no line matching means refused."""
    return "\n".join([
        "# Written by `eosink stack up --secure` on every start; edits are lost.",
        "# TYPE    DATABASE  USER      ADDRESS        METHOD",
        f"local     all       {ADMIN_ROLE:<9} peer map={IDENT_MAP}",
        "hostnossl all       all       all            reject",
        "hostssl   all       all       127.0.0.1/32   scram-sha-256",
        "hostssl   all       all       ::1/128        scram-sha-256",
        "",
    ])


def ident(server_user: str) -> str:
    """pg_ident.conf: the OS account running the server may be the admin role over the socket."""
    return f"# MAPNAME  SYSTEM-USERNAME  PG-USERNAME\n{IDENT_MAP} {server_user} {ADMIN_ROLE}\n"


def passfile(m: Material) -> Path:
    return m.directory / PASSFILE


def client_params(m: Material) -> str:
    """The query string of every secure DSN: verify the server against the stack's CA, password from pgpass."""
    return (f"sslmode=verify-full&sslrootcert={quote(str(m.ca_cert), safe='/')}"
            f"&passfile={quote(str(passfile(m)), safe='/')}")


def _pgpass_field(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


def write_passfile(m: Material, port: int) -> None:
    """``host:port:database:user:password`` per role; 0600, or libpq ignores it."""
    lines = [":".join(_pgpass_field(x) for x in (host, str(port), "*", USERS[role], m.password(role)))
             for host in (HOST, "localhost") for role in (ADMIN_PASSWORD_ROLE, SINK_PASSWORD_ROLE)]
    write_private(passfile(m), ("\n".join(lines) + "\n").encode())


def scram_verifier(password: str, iterations: int = SCRAM_ITERATIONS) -> str:
    """What PostgreSQL stores for a scram-sha-256 password (RFC 5802/7677; ``pg_authid.rolpassword``)."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def provision(admin_dsn: str, m: Material, database: str) -> None:
    """Create or re-assert the sink role, its schema and the revocations; idempotent, every start.

    Re-asserted rather than created once: a grant removed by hand (a test proving what the sink
    needs does exactly that) is back after the next ``stack up``.
    """
    own_schema(admin_dsn, m, SINK_PASSWORD_ROLE, database)


def own_schema(admin_dsn: str, m: Material, password_role: str, database: str) -> None:
    """Role ``USERS[password_role]`` (LOGIN, nothing more) with CONNECT on ``database`` alone and a schema of
    its own name there as its ``search_path``; PUBLIC loses CONNECT and schema ``public``.

    ``admin_dsn`` connects the admin to ``database``. One shape for every role a stack component uses
    (the sink's, the Schema Registry's storage), so each reaches its own tables and the catalogs only.
    """
    import psycopg
    from psycopg import sql

    name = USERS[password_role]
    role, schema = sql.Identifier(name), sql.Identifier(name)
    attrs = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT")
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn, conn.transaction():
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE ROLE {} {}").format(role, attrs))
        conn.execute(sql.SQL("ALTER ROLE {} {} PASSWORD {}").format(
            role, attrs, sql.Literal(scram_verifier(m.password(password_role)))))
        for db in (database, "postgres"):
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db)))
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), role))
        conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(schema, role))
        conn.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(schema, role))
        conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(schema, role))
        conn.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} SET search_path = {}").format(
            role, sql.Identifier(database), schema))
