"""The PostgreSQL sink's connections: leasing them, checking the server, naming their errors.

The sink leases two kinds of connection from its worker's pool for the database
(:mod:`eosink.connectors.postgres.pool`): an autocommit one for a moment - manifests, DDL,
COMMIT/ROLLBACK PREPARED, recovery - and a two-phase one from ``tpc_begin`` until PREPARE returns
(or the transaction is rolled back). They live apart from the commit cycle because how a
connection is made (DSN, timeouts, retries, time zone), which server is acceptable
(``max_prepared_transactions`` > 0) and how a psycopg error becomes an outcome class (retryable
for lost connections and lock timeouts, fatal otherwise) are one concern, shared by every phase of
the cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from eosink.connectors.api.errors import ConfigError, EosinkError, FatalError, RetryableError
from eosink.connectors.postgres import access, refusal
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres import pool as pgpool
from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres.config import Settings
from eosink.connectors.postgres.rejects import COMPONENT, describe

T = TypeVar("T")


def where(params: dict[str, Any]) -> str:
    """``host:port/database`` of connection parameters: how errors, pool gauges and logs name a database."""
    host, port = str(params.get("host") or "localhost"), params.get("port") or 5432
    return f"{host}:{port}/{params.get('dbname') or params.get('user') or ''}"


class PostgresConnections:
    """Connection handling mixed into :class:`~eosink.connectors.postgres.sink.PostgresSink`.

    The sink's ``__init__`` sets the attributes declared here. ``_ac`` is the autocommit connection
    while :meth:`_with_ac` holds its lease (a nested call uses it), ``_tx`` the two-phase one while a
    transaction is open on it; between those, the sink holds no connection.
    """

    connector: str
    config: dict[str, Any]
    _ac: psycopg.Connection[Any] | None  # autocommit: manifests, DDL, COMMIT/ROLLBACK PREPARED, recovery
    _tx: psycopg.Connection[Any] | None  # the two-phase transaction, from tpc_begin to PREPARE
    _tx_state: str  # idle | active | prepare-sent
    _bootstrapped: bool
    _leases: pgpool.Pool | None
    settings: Settings

    def _target_tables(self) -> list[access.TableKey]:
        """The target tables this sink has written or resolved so far (for naming a missing grant)."""
        return []

    def _rollback_tx(self) -> None:
        """End a failed two-phase transaction on ``_tx``; drop the connection if in doubt.

        After ``PREPARE TRANSACTION`` was sent, psycopg's ``tpc_rollback()`` would issue
        ROLLBACK PREPARED for the GID - which, if the failure was "GID already in use", would
        roll back somebody else's prepared transaction. Closing the connection instead rolls back
        only what is not prepared.
        """
        conn, state = self._tx, self._tx_state
        self._tx_state = "idle"
        if conn is None:
            return
        if state == "idle":
            self._release_tx()
            return
        if state == "active" and not (conn.broken or conn.closed):
            try:
                conn.tpc_rollback()
                self._release_tx()
                return
            except psycopg.Error:
                pass
        self._release_tx(discard=True)

    def _release_tx(self, discard: bool = False) -> None:
        """Give the two-phase connection back to the pool (closed instead when ``discard``, broken,
        or still inside a transaction): after PREPARE, the prepared transaction needs no session."""
        conn, self._tx = self._tx, None
        self._tx_state = "idle"
        if conn is not None:
            self._pool().release(conn, False, discard=discard)

    def _pool(self) -> pgpool.Pool:
        if self._leases is None:
            key = pgpool.PoolKey(self.config["connection.url"], str(self.config["connection.user"] or ""),
                                 str(self.config["connection.password"] or ""), int(self.config["lock.timeout.ms"]),
                                 str(self.config["db.timezone"] or ""))
            self._leases = pgpool.pool_for(key, where(self._dsn()))
        return self._leases

    def _app_name(self) -> str:
        return f"eosink/{self.connector}"[:63]

    def _dsn(self) -> dict[str, Any]:
        try:
            return conninfo_to_dict(self.config["connection.url"])
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"not a valid PostgreSQL DSN: {exc}", key="connection.url", source=f"connector '{self.connector}'") from None

    def _connect(self, autocommit: bool) -> psycopg.Connection[Any]:
        url = self.config["connection.url"]
        kwargs: dict[str, Any] = {"autocommit": autocommit, "application_name": self._app_name()}
        given = self._dsn()
        # A link that goes silent (a partition, a dead host) must end in an error, not a commit that
        # hangs until the kernel gives up (~15 min): TCP keepalives and a user timeout, unless the
        # DSN sets its own.
        for k, v in (("connect_timeout", 10), ("keepalives", 1), ("keepalives_idle", 10), ("keepalives_interval", 5),
                     ("keepalives_count", 3), ("tcp_user_timeout", 30_000)):
            if k not in given:
                kwargs[k] = v
        if self.config["connection.user"]:
            kwargs["user"] = self.config["connection.user"]
        if self.config["connection.password"]:
            kwargs["password"] = self.config["connection.password"]
        attempts, backoff = int(self.config["connection.attempts"]), self.config["connection.backoff.ms"] / 1000
        tz = self.config["db.timezone"]
        for attempt in range(1, attempts + 1):
            try:
                conn = psycopg.connect(url, **kwargs)
                conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(self.config['lock.timeout.ms'])}ms",))
                if tz:
                    conn.execute("SELECT set_config('TimeZone', %s, false)", (tz,))
                if not autocommit:
                    conn.commit()
                break
            except psycopg.OperationalError as exc:
                refused = refusal.classify(str(exc), {**given, **kwargs}, self.connector)
                if refused is not None:
                    raise refused from None
                full = refusal.server_full(str(exc), exc.sqlstate)
                if full is not None and attempt == attempts:
                    raise self._out_of_connections(full, str(exc), {**given, **kwargs}) from None
                if attempt == attempts:
                    raise RetryableError(f"cannot connect to PostgreSQL ({attempt} attempt(s), connection.attempts): {exc}".strip(),
                                         component=COMPONENT) from exc
                time.sleep(backoff)
            except psycopg.DataError as exc:  # set_config: a zone the server does not know
                raise ConfigError(f"PostgreSQL refuses time zone {tz!r}: {exc}", key="db.timezone",
                                  source=f"connector '{self.connector}'") from None
        pgc.register_dumpers(conn)
        return conn

    def _out_of_connections(self, limit: str, said: str, params: dict[str, Any]) -> pgpool.NoConnectionSlot:
        """The server is full (SQLSTATE 53300): a retryable error naming the database and the limit
        (its value read over an idle connection of the pool when there is one)."""
        read = None
        other = self._pool().idle_autocommit()
        if other is not None:
            try:
                read = refusal.limits(other)
            finally:
                self._pool().release(other, True)
        detail = read if read and limit == "max_connections" else "; ".join(x for x in (limit, read) if x)
        return pgpool.NoConnectionSlot(
            f"PostgreSQL at {where(params)} has no connection slot left for connector '{self.connector}' (limit: {detail}; the "
            f"server said: {' '.join(said.split())}); retrying - this worker's postgres sinks share at most "
            f"{self._pool().size} connections to it ({pgpool.ENV} / --postgres-pool-size): raise max_connections or "
            "lower the pool size of the workers writing to this server", component=COMPONENT)

    def _lease_ac(self) -> psycopg.Connection[Any]:
        """An autocommit connection from the pool; the first one this sink gets checks the server
        and creates the bookkeeping tables."""
        pool = self._pool()
        try:
            conn = pool.lease(True, self._connect, self._app_name())
        except psycopg.Error as exc:  # naming a connection just made failed: it went away at once
            raise self._error(exc, None, "connecting") from exc
        assert conn is not None
        if not self._bootstrapped:
            try:
                self._check_server(conn)
                pgs.bootstrap(conn)
            except BaseException as exc:
                pool.release(conn, True, discard=True)
                if isinstance(exc, psycopg.Error):
                    raise self._error(exc, None, "creating the bookkeeping tables") from exc
                raise
            self._bootstrapped = True
        return conn

    def _tcon(self, wait: bool = True) -> psycopg.Connection[Any] | None:
        """The two-phase connection, leased from the pool if the sink holds none (None when ``wait``
        is false and the pool has none free at once)."""
        if self._tx is not None and (self._tx.closed or self._tx.broken):
            self._release_tx(discard=True)
        if self._tx is None:
            try:
                self._tx = self._pool().lease(False, self._connect, self._app_name(), wait=wait)
            except psycopg.Error as exc:  # naming a connection just made failed: it went away at once
                raise self._error(exc, None, "connecting") from exc
            self._tx_state = "idle"
        return self._tx

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SHOW max_prepared_transactions").fetchone()
        if row is None or int(row[0]) <= 0:
            info = conn.info
            raise FatalError(
                f"PostgreSQL at {info.host}:{info.port}/{info.dbname} has max_prepared_transactions = 0, so two-phase "
                "commit is disabled. Set max_prepared_transactions (at least the number of sink tasks writing to this "
                "server, e.g. 64) in postgresql.conf and restart PostgreSQL.",
                component=COMPONENT,
            )

    def _with_ac(self, fn: Callable[[psycopg.Connection[Any]], T], what: str = "statement") -> T:
        """Run an idempotent ``fn`` on an autocommit connection, reconnecting once if it broke.

        Everything run here may be repeated (the sink contract makes every operation idempotent),
        so a connection found dead - e.g. after a server restart - costs a retry, not a cycle. The
        lease is held for ``fn`` only; a call from inside ``fn`` runs on the same connection.
        """
        if self._ac is not None:  # nested: the enclosing call holds the lease and retries
            conn = self._ac
            try:
                return fn(conn)
            except psycopg.Error as exc:
                raise self._error(exc, conn, what) from exc
        for attempt in (1, 2):
            conn = self._ac = self._lease_ac()
            try:
                return fn(conn)
            except psycopg.Error as exc:
                if attempt == 1 and (conn.broken or conn.closed) and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                    continue
                raise self._error(exc, conn, what) from exc
            finally:
                self._ac = None
                self._pool().release(conn, True)
        raise AssertionError("unreachable")

    def _error(self, exc: psycopg.Error, conn: psycopg.Connection[Any] | None, what: str) -> EosinkError:
        """Retryable for lost connections, timeouts and serialization failures; fatal otherwise."""
        if conn is not None and (conn.broken or conn.closed) and conn is self._tx:
            self._release_tx(discard=True)
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return RetryableError(
                f"{what} failed: {exc}; waited lock.timeout.ms={self.config['lock.timeout.ms']} for a lock - a prepared "
                "transaction (see pg_prepared_xacts) or a long-running statement holds it".strip(),
                component=COMPONENT,
            )
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return RetryableError(f"{what} failed: {exc}".strip(), component=COMPONENT)
        if isinstance(exc, access.PRIVILEGE_ERRORS):
            lacking = self._lacking()
            if lacking:
                return FatalError(f"{what} failed: permission denied: role {lacking[0]} lacks {'; '.join(lacking[1:])} "
                                  f"(GRANT it to the role; the server said: {describe(exc)})", component=COMPONENT)
        return FatalError(f"{what} failed: {describe(exc)}", component=COMPONENT)

    def _lacking(self) -> list[str]:
        """``[role, "INSERT on table s.t", ...]`` for what the sink's role lacks, or [] when nothing
        (or the check itself failed: the caller then reports the server's own message)."""
        own = self._ac is not None and not (self._ac.closed or self._ac.broken)
        try:
            conn = self._ac if own and self._ac is not None else self._connect(autocommit=True)
        except EosinkError:
            return []
        try:
            role = conn.execute("SELECT current_user").fetchone()
            wanted = access.needs(self.settings, self._target_tables())
            lacking = access.missing(conn, wanted, create=bool(self.config["auto.create"]) or self.settings.staged)
            return [str(role[0] if role else "?"), *lacking] if lacking else []
        except psycopg.Error:
            return []
        finally:
            if conn is not self._ac:
                conn.close()
