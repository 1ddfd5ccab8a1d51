"""A private PostgreSQL of the product's stack with server settings of a test's own (never the shared one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faultkit import PrivateStack


@contextlib.contextmanager
def private_postgres(home: Path, **settings: int | str) -> Iterator[PrivateStack]:
    """A PostgreSQL under ``home``, restarted with ``ALTER SYSTEM SET key = value`` for each setting
    (``max_connections`` needs a restart), stopped at the end."""
    with pytest.MonkeyPatch.context() as mp:
        pg = PrivateStack(home, mp, postgres=True).start()
        try:
            with psycopg.connect(pg.endpoints().postgres_dsn, autocommit=True) as c:
                for key, value in settings.items():
                    c.execute(f"ALTER SYSTEM SET {key} = {value}")
            component = pg.component("postgres")
            argv = [str(component._bindir() / "pg_ctl"), "-D", str(component.pgdata), "-m", "fast", "-w", "stop"]
            assert component._run(argv) == 0, f"pg_ctl stop failed; see {component.log_path}"
            pg.restart("postgres")
            with psycopg.connect(pg.endpoints().postgres_dsn) as c:
                for key, value in settings.items():
                    assert c.execute(f"SHOW {key}").fetchone() == (str(value),), f"{key} is not {value} after the restart"
            yield pg
        finally:
            pg.stop()


def assert_every_id_once(admin: psycopg.Connection[Any], tables: Iterable[str], committed: set[str], aborted: set[str]) -> None:
    """Each table holds every committed id once, nothing else (nothing from an aborted transaction)."""
    for table in tables:
        ids = [r[0] for r in admin.execute(f'SELECT id FROM "{table}"')]
        assert len(ids) == len(set(ids)), f"{table}: {len(ids) - len(set(ids))} duplicates"
        assert set(ids) == committed, f"{table}: missing {len(committed - set(ids))}, from aborted {len(set(ids) & aborted)}"
