"""PostgreSQL from the Debian packages, one cluster per stack, with prepared transactions enabled.

Where the data lives: ``/tmp/eosink-pg-<sha1 of the stack dir>/`` (``data/`` and ``socket/``),
not under the stack dir. As root, initdb and postgres must run as the ``postgres`` user, which
cannot traverse homes like ``/root``; ``/tmp`` is traversable by everyone, and its short path
keeps the unix socket under the 107-byte limit however deep ``EOSINK_HOME`` is. The stack dir
keeps a marker (``postgres/initialized``); a data dir whose marker is gone belongs to a stack
that was wiped (``make clean``), and is removed rather than silently reused.

**Secure stack** (``layout.secure``, see :mod:`eosink.worker.stack.pg_secure`): TLS with the
stack's server certificate, ``scram-sha-256`` over ``hostssl`` only, the admin role ``eosink``
with a password, and the sink role ``eosink_sink`` that owns its own schema and nothing else.
Clients find the password in a pgpass file (libpq ``passfile=``), so no DSN carries one.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any

from eosink.worker.stack import pg_secure, proc
from eosink.worker.stack import secure as secure_material
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.layout import HOST

PORT_ENV = "EOSINK_POSTGRES_PORT"
USER = "eosink"
DATABASE = "eosink"
SERVER_USER = "postgres"  # the account that runs initdb/postgres when we are root


def _is_root() -> bool:
    return os.geteuid() == 0


class Postgres(Component):
    name = "postgres"
    ready_timeout_s = 60.0
    stop_timeout_s = 30.0

    @property
    def base_dir(self) -> Path:
        digest = hashlib.sha1(str(self.layout.root).encode()).hexdigest()[:12]
        return Path("/tmp") / f"eosink-pg-{digest}"

    @property
    def pgdata(self) -> Path:
        return self.base_dir / "data"

    @property
    def marker(self) -> Path:
        return self.data_dir / "initialized"

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: self.layout.port(PORT_ENV)}

    def dsn(self, database: str = DATABASE, user: str = USER) -> str:
        """The admin's DSN (``user`` for another role); on a secure stack with TLS verified and the
        password in the stack's pgpass file, never in the DSN itself."""
        base = f"postgresql://{user}@{HOST}:{self.layout.port(PORT_ENV)}/{database}"
        if not self.layout.secure:
            return base
        return base + "?" + pg_secure.client_params(secure_material.material(self.layout))

    def endpoint(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"dsn": self.dsn(), "port": self.layout.port(PORT_ENV)}
        if self.layout.secure:
            m = secure_material.material(self.layout)
            entry |= {"sink_dsn": self.dsn(user=pg_secure.SINK_ROLE), "sink_user": pg_secure.SINK_ROLE,
                      "sink_schema": pg_secure.SINK_SCHEMA, "sslrootcert": str(m.ca_cert),
                      "passfile": str(pg_secure.passfile(m)),
                      "sink_password": m.reference(pg_secure.SINK_PASSWORD_ROLE)}
        return entry

    def address(self) -> str:
        return self.dsn()

    @property
    def workdir(self) -> Path:
        """The postmaster changes into its data directory."""
        return self.pgdata

    def launch(self) -> int:
        bindir = self._bindir()
        self._init_cluster(bindir)
        argv = [str(bindir / "pg_ctl"), "-D", str(self.pgdata), "-w", "-t", str(int(self.ready_timeout_s)), "start"]
        # No `pg_ctl -l`: the postgres user may not be able to open a file under the stack dir.
        # The server inherits pg_ctl's stdout/stderr instead, opened here (by us) on postgres.log.
        if self._run(argv) != 0:
            late = self._postmaster_pid()  # a server still starting after pg_ctl gave up
            if late is not None and proc.alive(late, self.workdir):
                self.terminate(late)
            raise self.fail("pg_ctl could not start the server")
        pid = self._postmaster_pid()
        if pid is None:
            raise self.fail(f"pg_ctl reported a start but {self.pgdata / 'postmaster.pid'} is unreadable")
        try:
            self._create_database()
        except Exception as e:  # noqa: BLE001 - whatever failed, stop the server we started, then report it
            self.terminate(pid)
            raise self.fail(f"the server started but creating database {DATABASE!r} failed: {e}") from None
        if self.layout.secure:
            try:
                pg_secure.provision(self.dsn(DATABASE), secure_material.material(self.layout), DATABASE)
            except Exception as e:  # noqa: BLE001 - as above: never leave a half-provisioned server running
                self.terminate(pid)
                raise self.fail(f"the server started but creating the sink role failed: {e}") from None
        self.marker.write_text(f"{self.base_dir}\n")
        return pid

    def probe(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
            conn.execute("SELECT 1").fetchone()

    def terminate(self, pid: int) -> set[int]:
        """``pg_ctl stop -m fast`` rolls back open transactions and keeps prepared ones; the
        tree kill afterwards only mops up if the fast stop did not finish. Backends run in
        sessions of their own, so the family is snapshotted while the postmaster still lives."""
        known = proc.family(pid)
        self._run([str(self._bindir() / "pg_ctl"), "-D", str(self.pgdata), "-w",
                   "-t", str(int(self.stop_timeout_s)), "-m", "fast", "stop"])
        return proc.kill_tree(pid, 5.0, known)

    def _bindir(self) -> Path:
        """The newest Debian PostgreSQL, installing the package when we are root and it is missing."""
        found = self._find_bindir()
        if found is None and _is_root() and shutil.which("apt-get"):
            with open(self.log_path, "ab") as log:
                for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
                    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, check=False)
            found = self._find_bindir()
        if found is None:
            raise self.fail(
                "no PostgreSQL server binaries (initdb) found in /usr/lib/postgresql/*/bin or on PATH"
                + (" and `apt-get install -y postgresql` did not provide them" if _is_root() else
                   "; install them with `sudo apt-get install -y postgresql`")
            )
        return found

    @staticmethod
    def _find_bindir() -> Path | None:
        versions = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
        numbered = [d for d in versions if d.parent.name.isdigit()]
        if numbered:
            return max(numbered, key=lambda d: int(d.parent.name))
        on_path = shutil.which("initdb")
        return Path(on_path).resolve().parent if on_path else None

    def _init_cluster(self, bindir: Path) -> None:
        """initdb once; rewrite eosink.conf on every start (the port may have changed)."""
        if self.base_dir.is_symlink():
            raise self.fail(f"{self.base_dir} is a symlink; refusing to use it as a data dir")
        if self.base_dir.exists() and not self.marker.exists():
            self._discard_orphan(bindir)
        if not (self.pgdata / "PG_VERSION").exists():
            for path in (self.base_dir, self.pgdata, self.base_dir / "socket"):
                path.mkdir(mode=0o700, exist_ok=True)
                self._chown(path)
            argv = [str(bindir / "initdb"), "-D", str(self.pgdata), "-U", USER, "-E", "UTF8", "--locale=C"]
            if self.layout.secure:
                self._initdb_secure(argv)
            else:
                argv.append("--auth=trust")
                if self._run(argv) != 0:
                    raise self.fail(f"initdb failed for {self.pgdata}")
        (self.base_dir / "socket").mkdir(mode=0o700, exist_ok=True)
        self._chown(self.base_dir / "socket")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.pgdata / "eosink.conf"
        conf.write_text("\n".join([
            f"port = {self.layout.port(PORT_ENV)}",
            f"listen_addresses = '{HOST}'",
            f"unix_socket_directories = '{self.base_dir / 'socket'}'",
            "max_connections = 200",
            "max_prepared_transactions = 64",  # two-phase commit is the point of the sink
            "shared_buffers = 128MB",
            "fsync = on",
            "logging_collector = off",  # stderr is postgres.log (see launch)
            "log_destination = 'stderr'",
            "log_line_prefix = '%m [%p] '",
            *(self._secure_settings() if self.layout.secure else []),
            "",
        ]))
        self._chown(conf)
        main_conf = self.pgdata / "postgresql.conf"
        include = "include 'eosink.conf'"
        if include not in main_conf.read_text():
            with open(main_conf, "a") as f:
                f.write(f"\n{include}\n")

    # -- secure stack ---------------------------------------------------------------------------
    def _initdb_secure(self, argv: list[str]) -> None:
        """initdb with the admin's password from the start: the server never runs with ``trust``.

        The password file sits in the (0700, server-owned) base dir for the run of initdb only.
        """
        m = secure_material.material(self.layout)
        pwfile = self.base_dir / ".pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(m.password(pg_secure.ADMIN_PASSWORD_ROLE) + "\n")
        self._chown(pwfile)
        try:
            code = self._run([*argv, "--auth-local=peer", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"])
        finally:
            pwfile.unlink(missing_ok=True)
        if code != 0:
            raise self.fail(f"initdb failed for {self.pgdata}")

    def _secure_settings(self) -> list[str]:
        """TLS and authentication, rewritten on every start with the stack's current certificate."""
        m = secure_material.material(self.layout)
        for src, name in ((m.server_cert, pg_secure.CERT_FILE), (m.server_key, pg_secure.KEY_FILE)):
            dest = self.pgdata / name
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(src.read_bytes())
            os.chmod(dest, 0o600)  # an existing file keeps its mode through O_CREAT: PostgreSQL refuses a readable key
            self._chown(dest)
        server_user = SERVER_USER if _is_root() else pwd.getpwuid(os.geteuid()).pw_name
        for name, text in ((pg_secure.HBA_FILE, pg_secure.hba()), (pg_secure.IDENT_FILE, pg_secure.ident(server_user))):
            (self.pgdata / name).write_text(text)
            self._chown(self.pgdata / name)
        pg_secure.write_passfile(m, self.layout.port(PORT_ENV))
        return pg_secure.server_settings()

    def _discard_orphan(self, bindir: Path) -> None:
        """Remove the data dir of a wiped stack, stopping its server first if one still runs."""
        proc.mark_log(self.log_path, f"discarding {self.base_dir}: its stack dir was wiped")
        if (self.pgdata / "postmaster.pid").exists():
            self._run([str(bindir / "pg_ctl"), "-D", str(self.pgdata), "-w", "-m", "immediate", "stop"])
        shutil.rmtree(self.base_dir)

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=5) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _run(self, argv: list[str]) -> int:
        """Run a PostgreSQL tool as the server's user, output appended to postgres.log."""
        if _is_root():
            argv = ["runuser", "-u", SERVER_USER, "--", *argv]
        with open(self.log_path, "ab") as log:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=self.base_dir if self.base_dir.exists() else "/",
                                  start_new_session=True, check=False).returncode

    def _chown(self, path: Path) -> None:
        if not _is_root():
            return
        try:
            entry = pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise self.fail(f"running as root needs the {SERVER_USER!r} user to run the server, and it does not exist "
                            "(the Debian `postgresql` package creates it)") from None
        os.chown(path, entry.pw_uid, entry.pw_gid)
