"""Connections to one PostgreSQL database, shared by every postgres sink of a worker process.

A sink needs a connection only while it talks to the server: an *autocommit* one for a moment
(manifests, DDL, COMMIT/ROLLBACK PREPARED, recovery) and a *two-phase* one from ``tpc_begin``
until ``PREPARE TRANSACTION`` returns (or the transaction is rolled back). A prepared transaction
holds no connection: any session of the same role commits it. So the sinks of one worker that
reach the same database (server, database, role and session settings: :class:`PoolKey`) lease
from one :class:`Pool` of at most ``size`` connections, instead of keeping two each for as long
as they run: N connectors cost ``size`` slots of the server's ``max_connections`` per worker,
not 2 x N.

Why two kinds, each with its own queue. A sink holding a two-phase connection still needs an
autocommit one to finish its cycle (the manifest is written before PREPARE); a sink leasing an
autocommit connection never waits for anything else while it holds it. Two-phase leases are
therefore capped at ``size - reserve``: the autocommit kind always has ``reserve`` connections it
can get, so a holder of a two-phase lease is never stuck behind a queue it blocks itself. Idle
connections of each kind are kept apart (psycopg's two-phase state stays on a connection after
PREPARE, and an autocommit connection must never carry it), and an idle one of the other kind is
closed to make room when the pool is full.

Leases are FIFO within a kind, and a lease that must not wait (a sink that would like to stream
its rows into a transaction from the first write, see
:mod:`eosink.connectors.postgres.streaming`) is refused while others queue: a connector that
streams its cycles back to back cannot starve those that wait. A lease that waits longer than
:data:`LEASE_TIMEOUT_S` is a :class:`~eosink.connectors.api.errors.RetryableError` naming the
database and the size.

States of one connection::

    (connecting) -> leased -> idle -> leased -> ... -> closed
                           \\-> closed (broken, or left inside a transaction)
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq

from eosink.connectors.api.errors import ConfigError, RetryableError

#: ``--postgres-pool-size`` / ``EOSINK_POSTGRES_POOL_SIZE``: connections one worker opens to one database.
ENV = "EOSINK_POSTGRES_POOL_SIZE"
DEFAULT_SIZE = 20
#: How long a sink waits for a connection of a full pool before its cycle is retried.
LEASE_TIMEOUT_S = 60.0
#: An idle connection unused this long is closed: a worker keeps only what its sinks use, and gives
#: the server's slots back for other workers (and other clients) when its load drops.
IDLE_TIMEOUT_S = 10.0

Conn = psycopg.Connection[Any]


class NoConnectionSlot(RetryableError):
    """The server refused a new connection because it is full (SQLSTATE 53300): the pool closes an
    idle connection of its own and tries once more before passing it on."""


@dataclass(frozen=True, slots=True)
class PoolKey:
    """What makes two sinks' connections interchangeable: the same server, database, role,
    password and session settings (``lock_timeout``, ``TimeZone``)."""

    url: str
    user: str
    password: str
    lock_timeout_ms: int
    timezone: str


@dataclass(slots=True)
class _Kind:
    idle: list[Conn]
    queue: collections.deque[object]
    leased: int = 0


class Pool:
    """At most ``size`` connections to one database, leased by kind (autocommit or two-phase)."""

    def __init__(self, where: str, size: int) -> None:
        if size < 2:
            raise ConfigError(f"a PostgreSQL pool needs at least 2 connections, not {size}", key=ENV)
        self.where = where
        self.size = size
        self.reserve = max(1, size // 5)
        self._cond = threading.Condition()
        self._kinds = {True: _Kind([], collections.deque()), False: _Kind([], collections.deque())}
        self._since: dict[int, float] = {}  # id(idle conn) -> when it went idle (idle lists are oldest first)

    # -- accounting ------------------------------------------------------------------------
    def _open(self) -> int:
        return sum(k.leased + len(k.idle) for k in self._kinds.values())  # a lease being connected counts as leased

    def stats(self) -> dict[str, int]:
        """Connections open, idle and leased by kind (for ``/status``, metrics and tests)."""
        with self._cond:
            ac, tx = self._kinds[True], self._kinds[False]
            return {"open": self._open(), "size": self.size, "autocommit_leased": ac.leased, "autocommit_idle": len(ac.idle),
                    "transaction_leased": tx.leased, "transaction_idle": len(tx.idle)}

    def _grantable(self, autocommit: bool) -> bool:
        """Under the lock: can a lease of this kind be granted now (from idle, or a new connection)?"""
        kind = self._kinds[autocommit]
        if not autocommit and kind.leased >= self.size - self.reserve:
            return False
        return bool(kind.idle) or self._open() < self.size or bool(self._kinds[not autocommit].idle)

    # -- leasing ---------------------------------------------------------------------------
    def lease(self, autocommit: bool, connect: Callable[[bool], Conn], name: str, *, wait: bool = True) -> Conn | None:
        """A connection of this kind carrying ``application_name = name``; None when ``wait`` is
        false and none is free at once. ``connect(autocommit)`` opens a new one (its errors pass
        through: the server refusing, 53300 "too many clients", are the caller's to name)."""
        kind = self._kinds[autocommit]
        spare: Conn | None = None
        conn: Conn | None = None
        with self._cond:
            if not wait and (kind.queue or not self._grantable(autocommit)):
                return None
            ticket = object()
            kind.queue.append(ticket)
            deadline = time.monotonic() + LEASE_TIMEOUT_S
            try:
                while kind.queue[0] is not ticket or not self._grantable(autocommit):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RetryableError(
                            f"all {self.size} connections of this worker's pool for PostgreSQL at {self.where} stayed in use "
                            f"for {LEASE_TIMEOUT_S:.0f} s ({ENV} / --postgres-pool-size); retrying", component="postgres")
                    self._cond.wait(left)
            finally:
                kind.queue.remove(ticket)
                self._cond.notify_all()  # the next in line may be grantable now
            conn = kind.idle.pop() if kind.idle else None  # the newest: the oldest may go idle long enough to close
            if conn is None and self._open() >= self.size:
                spare = self._kinds[not autocommit].idle.pop(0)  # the other kind's oldest: closed below
            for c in (conn, spare):
                self._since.pop(id(c), None)
            kind.leased += 1
        if spare is not None:
            _close(spare)
        if conn is not None:
            try:
                self._name(conn, autocommit, name)
                return conn
            except psycopg.Error:  # died while idle (the server restarted): a new one in its place
                _close(conn)
        try:
            try:
                conn = connect(autocommit)
            except NoConnectionSlot as full:
                # Full: this pool's idle connections (of the other kind: of this kind there is none)
                # hold slots every worker needs. Give one back and try again; a worker holding idle
                # autocommit connections could otherwise wait forever for a two-phase one.
                if not self._close_one_idle():
                    raise
                try:
                    conn = connect(autocommit)
                except NoConnectionSlot:
                    raise full from None  # the first names the limit's value, read over the idle connection
            self._name(conn, autocommit, name)
        except BaseException:
            with self._cond:
                kind.leased -= 1
                self._cond.notify_all()
            if conn is not None:
                _close(conn)
            raise
        return conn

    def _close_one_idle(self) -> bool:
        with self._cond:
            idle = next((k.idle for k in self._kinds.values() if k.idle), None)
            conn = idle.pop(0) if idle else None
            self._since.pop(id(conn), None)
        if conn is None:
            return False
        _close(conn)
        time.sleep(0.05)  # the server frees the slot once the backend has exited
        return True

    def _name(self, conn: Conn, autocommit: bool, name: str) -> None:
        """``application_name`` follows the connector using the connection (``pg_stat_activity``,
        ``pg_terminate_backend`` by name); one round trip, only when it changes."""
        if conn.info.parameter_status("application_name") == name.encode():  # reported by the server as it changes
            return
        if not autocommit:
            conn.autocommit = True  # a set_config outside any transaction: no COMMIT round trip
        try:
            conn.execute("SELECT set_config('application_name', %s, false)", (name,))
        finally:
            if not autocommit and not (conn.closed or conn.broken):
                conn.autocommit = False

    def release(self, conn: Conn, autocommit: bool, *, discard: bool = False) -> None:
        """Give a leased connection back; one that broke, is closed or is still inside a
        transaction (or ``discard``) is closed instead of kept."""
        keep = not discard and not (conn.closed or conn.broken) and conn.info.transaction_status == pq.TransactionStatus.IDLE
        with self._cond:
            kind = self._kinds[autocommit]
            kind.leased -= 1
            if keep:
                kind.idle.append(conn)
                self._since[id(conn)] = time.monotonic()
            self._cond.notify_all()
        if not keep:
            _close(conn)

    def idle_autocommit(self) -> Conn | None:
        """An idle autocommit connection, leased without opening one (None if there is none): for
        reading the server's limits when it refuses a new connection."""
        with self._cond:
            kind = self._kinds[True]
            if not kind.idle:
                return None
            kind.leased += 1
            conn = kind.idle.pop()
            self._since.pop(id(conn), None)
            return conn

    def reap(self, older_than_s: float) -> int:
        """Close the idle connections unused for ``older_than_s``; how many were closed."""
        now, old = time.monotonic(), []
        with self._cond:
            for kind in self._kinds.values():
                while kind.idle and now - self._since.get(id(kind.idle[0]), now) > older_than_s:
                    old.append(kind.idle.pop(0))
            for c in old:
                self._since.pop(id(c), None)
        for c in old:
            _close(c)
        return len(old)

    def close_idle(self) -> None:
        """Close every idle connection (a worker stopping, a test cleaning up)."""
        with self._cond:
            idle = [c for k in self._kinds.values() for c in k.idle]
            for k in self._kinds.values():
                k.idle.clear()
            self._since.clear()
        for c in idle:
            _close(c)


def _close(conn: Conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection may fail; nothing to do
        pass


# -- the worker's pools ---------------------------------------------------------------------
_POOLS: dict[PoolKey, Pool] = {}
_LOCK = threading.Lock()
_size: int | None = None
_reaper: threading.Thread | None = None


def _reap_forever() -> None:
    while True:
        time.sleep(IDLE_TIMEOUT_S / 2)
        with _LOCK:
            found = list(_POOLS.values())
        for p in found:
            p.reap(IDLE_TIMEOUT_S)


def configure(size: int) -> None:
    """Set the size of every pool this process makes from now on (the worker's ``--postgres-pool-size``)."""
    global _size
    if size < 2:
        raise ConfigError(f"--postgres-pool-size must be at least 2, not {size}", key="--postgres-pool-size")
    _size = size


def pool_size() -> int:
    """The configured size, else ``$EOSINK_POSTGRES_POOL_SIZE``, else :data:`DEFAULT_SIZE`."""
    if _size is not None:
        return _size
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_SIZE
    try:
        size = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV}={raw!r} is not a number of connections", key=ENV) from None
    if size < 2:
        raise ConfigError(f"{ENV}={raw!r}: a pool needs at least 2 connections", key=ENV)
    return size


def pool_for(key: PoolKey, where: str) -> Pool:
    """This process's pool for ``key`` (made on first use)."""
    global _reaper
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = Pool(where, pool_size())
        if _reaper is None:
            _reaper = threading.Thread(target=_reap_forever, name="postgres-pool-reaper", daemon=True)
            _reaper.start()
        return pool


def pools() -> dict[str, dict[str, int]]:
    """Every pool's :meth:`Pool.stats`, by database (``host:port/dbname``)."""
    with _LOCK:
        found = list(_POOLS.values())
    out: dict[str, dict[str, int]] = {}
    for p in found:
        s = p.stats()
        prior = out.get(p.where)
        out[p.where] = {k: v + prior.get(k, 0) for k, v in s.items()} if prior else s
    return out
