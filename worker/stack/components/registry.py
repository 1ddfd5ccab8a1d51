"""Schema Registry: Apicurio Registry, a Quarkus app fetched once from Maven Central.

The app's ``tar.gz:all`` archive is resolved by Maven into ``~/.m2`` and unpacked under
``~/.cache/eosink/apicurio-registry-<version>/`` (``.complete`` is written after a full unpack).
It needs Java 21+, which is not always the ``java`` on PATH: :func:`java21` looks for one.

Schemas live in the stack's PostgreSQL, in a database of their own (``eosink_registry``), so
they survive restarts. Both the API port and the management port (health) listen on 127.0.0.1;
the Confluent-compatible API is ``<url>/apis/ccompat/v7``, and every start sets the global
compatibility to BACKWARD (the app's own default is NONE).

A secure stack's registry (:mod:`eosink.worker.stack.registry_secure`) serves HTTPS only, with the
stack's certificate, and demands HTTP basic auth on every API path; it stores its schemas as a
PostgreSQL role of its own (``eosink_registry``, owner of its schema and nothing else) over TLS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eosink.worker.stack import jvm, pg_secure, proc, registry_secure
from eosink.worker.stack import secure as secure_material
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.components.postgres import PORT_ENV as POSTGRES_PORT_ENV
from eosink.worker.stack.components.postgres import USER as POSTGRES_USER
from eosink.worker.stack.components.postgres import Postgres
from eosink.worker.stack.errors import ComponentError
from eosink.worker.stack.gotools import run_with_progress
from eosink.worker.stack.layout import HOST

PORT_ENV = "EOSINK_REGISTRY_PORT"
MANAGEMENT_PORT_ENV = "EOSINK_REGISTRY_MANAGEMENT_PORT"
VERSION = "3.3.3"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{VERSION}:tar.gz:all"
DATABASE = "eosink_registry"
#: The Confluent-compatible API under the registry's URL (what connectors' ``schema.registry.url`` names).
CCOMPAT = "/apis/ccompat/v7"
COMPATIBILITY = "BACKWARD"
JAVA_MIN = 21
#: Connections are checked before use and every 5 s: without it, a PostgreSQL restart leaves the registry
#: holding dead connections and answering 500 until it is restarted too (measured on 3.3.3). The pool starts
#: at one connection and stops at 8: Apicurio's own defaults (20 held from the start, up to 100) would take a
#: fifth of a default ``max_connections`` from the sinks sharing the server, for lookups clients cache anyway.
POOL_FLAGS = ("-Dquarkus.datasource.postgresql.jdbc.validate-on-borrow=true",
              "-Dquarkus.datasource.postgresql.jdbc.background-validation-interval=5S",
              "-Dapicurio.datasource.jdbc.initial-size=1", "-Dapicurio.datasource.jdbc.min-size=1",
              "-Dapicurio.datasource.jdbc.max-size=8")
NAME = "registry"


def _java_version(java: Path) -> int | None:
    """The feature release of a JDK/JRE (``release`` file next to ``bin/``, else ``java -version``)."""
    release = java.parent.parent / "release"
    text = ""
    try:
        text = release.read_text()
    except OSError:
        try:
            text = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=20, check=False).stderr
        except (OSError, subprocess.SubprocessError):
            return None
    found = re.search(r'version "?(\d+)(?:\.(\d+))?', text, re.IGNORECASE) or re.search(r'JAVA_VERSION="(\d+)', text)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # 1.8 -> 8


def java21() -> str:
    """A ``java`` of release 21 or newer: ``$EOSINK_REGISTRY_JAVA_HOME``, ``$JAVA_HOME``, the newest under
    /usr/lib/jvm, or the one on PATH; a clear error naming what is missing otherwise."""
    candidates: list[Path] = []
    for var in ("EOSINK_REGISTRY_JAVA_HOME", "JAVA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "java")
    jvm_dir = Path("/usr/lib/jvm")
    if jvm_dir.is_dir():
        candidates += sorted(jvm_dir.glob("*/bin/java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve())
    seen: list[str] = []
    best: tuple[int, Path] | None = None
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        version = _java_version(java)
        seen.append(f"{java} ({version or 'unknown version'})")
        if version is not None and version >= JAVA_MIN and (best is None or version > best[0]):
            best = (version, java)
    if best is None:
        raise ComponentError(
            NAME, f"Apicurio Registry {VERSION} needs Java {JAVA_MIN}+, and none was found "
            f"(looked at $EOSINK_REGISTRY_JAVA_HOME, $JAVA_HOME, /usr/lib/jvm/*, PATH: {', '.join(seen) or 'no java at all'}); "
            "install a JDK 21+ (e.g. Temurin 21) or point EOSINK_REGISTRY_JAVA_HOME at one", None)
    return str(best[1])


def install_dir(report: Callable[[str], None] | None = None) -> Path:
    """The unpacked app (holding ``quarkus-run.jar``), fetched with Maven and unpacked on first use."""
    target = jvm.cache_root().parent / f"apicurio-registry-{VERSION}"
    if (target / ".complete").exists():
        return _app_dir(target)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ComponentError(NAME, f"`mvn` was not found on PATH; it is needed once to fetch {ARTIFACT} "
                             "(`apt-get install -y maven`)", None)
    with jvm._maven_turn, proc.file_lock(jvm.cache_root() / ".maven.lock"):
        if (target / ".complete").exists():
            return _app_dir(target)
        argv = [mvn, "-q", "-B", "-Dstyle.color=never", "dependency:get", f"-Dartifact={ARTIFACT}", "-Dtransitive=false"]
        done = run_with_progress(argv, None, f"fetching Apicurio Registry {VERSION} with Maven (158 MB, first run only)",
                                 NAME, sys.stderr, timeout_s=jvm.MAVEN_TIMEOUT_S)
        archive = _m2() / "io/apicurio/apicurio-registry-app" / VERSION / f"apicurio-registry-app-{VERSION}-all.tar.gz"
        if done.returncode != 0 or not archive.exists():
            tail = "\n".join(proc.strip_ansi(done.stdout + done.stderr).splitlines()[-20:])
            raise ComponentError(NAME, f"Maven failed to fetch {ARTIFACT} (exit {done.returncode}; command: {' '.join(argv)})",
                                 None, tail)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(partial, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        (target / ".complete").touch()
    return _app_dir(target)


def _m2() -> Path:
    return Path(os.environ.get("MAVEN_REPO_LOCAL") or Path.home() / ".m2" / "repository")


def _app_dir(target: Path) -> Path:
    found = sorted(target.rglob("quarkus-run.jar"))
    if not found:
        raise ComponentError(NAME, f"{target} holds no quarkus-run.jar; remove it to fetch the app again", None)
    return found[0].parent


class Registry(Component):
    name = NAME
    ready_timeout_s = 90.0
    stop_timeout_s = 20.0
    #: Started once these run: its storage is the stack's PostgreSQL.
    after = ("postgres",)

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: self.layout.port(PORT_ENV), MANAGEMENT_PORT_ENV: self.layout.port(MANAGEMENT_PORT_ENV)}

    def endpoint(self) -> dict[str, Any]:
        """``url`` is the Confluent-compatible API: what a connector's ``value.converter.schema.registry.url`` takes.

        A secure stack's entry also names the CA, the user and where the password is, and ``converter``:
        the Connect converter keys (without ``value.converter.``) that reach it."""
        url = self.address() + CCOMPAT
        health = f"{self._scheme()}://{HOST}:{self.layout.port(MANAGEMENT_PORT_ENV)}/health/ready"
        if self.layout.secure:
            return registry_secure.endpoint(secure_material.material(self.layout), url, health)
        return {"url": url, "health_url": health}

    def address(self) -> str:
        return f"{self._scheme()}://{HOST}:{self.layout.port(PORT_ENV)}"

    def _scheme(self) -> str:
        return "https" if self.layout.secure else "http"

    def prepare(self, report: Callable[[str], None]) -> None:
        install_dir(report)
        java21()

    def launch(self) -> int:
        app = install_dir()
        java = java21()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        pg_port = self.layout.port(POSTGRES_PORT_ENV)
        try:
            self._create_database()
        except Exception as e:  # noqa: BLE001 - any failure: the registry has nowhere to keep schemas
            raise self.fail(f"cannot create its database {DATABASE!r} in the stack's PostgreSQL on {HOST}:{pg_port} "
                            f"(is it running? `eosink stack up --only postgres`): {e}") from None
        env = {**os.environ, "APICURIO_STORAGE_KIND": "sql", "APICURIO_STORAGE_SQL_KIND": "postgresql"}
        port, management = self.layout.port(PORT_ENV), self.layout.port(MANAGEMENT_PORT_ENV)
        if self.layout.secure:
            m = secure_material.material(self.layout)
            registry_secure.write_config(m)
            env |= registry_secure.storage_env(m, pg_port, DATABASE)
            flags = registry_secure.server_flags(m, port, management)
        else:
            env |= {"APICURIO_DATASOURCE_URL": f"jdbc:postgresql://{HOST}:{pg_port}/{DATABASE}",
                    "APICURIO_DATASOURCE_USERNAME": POSTGRES_USER, "APICURIO_DATASOURCE_PASSWORD": POSTGRES_USER}
            flags = [f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={port}",
                     f"-Dquarkus.management.host={HOST}", f"-Dquarkus.management.port={management}"]
        argv = [java, "-Xms64m", "-Xmx192m", "-XX:-UsePerfData", "-Djava.awt.headless=true", *flags, *POOL_FLAGS,
                "-jar", str(app / "quarkus-run.jar")]
        return proc.spawn(argv, self.log_path, cwd=self.data_dir, env=env)

    def _create_database(self) -> None:
        """Its database; on a secure stack also its own role, owner of a schema there and of nothing else."""
        import psycopg

        postgres = Postgres(self.layout)
        with psycopg.connect(postgres.dsn("postgres"), autocommit=True, connect_timeout=5) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
        if self.layout.secure:
            pg_secure.own_schema(postgres.dsn(DATABASE), secure_material.material(self.layout),
                                 registry_secure.STORAGE_ROLE, DATABASE)

    def _send(self, request: urllib.request.Request, timeout: float) -> bytes:
        """``request`` answered by this registry (over TLS with the client's credentials on a secure stack)."""
        if self.layout.secure:
            return registry_secure.open_url(secure_material.material(self.layout), request, timeout)
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - loopback
            return bytes(answer.read())

    def probe(self) -> None:
        """Health on the management port; on a secure stack the API with credentials too (health alone would
        pass a registry whose user realm is broken)."""
        health = urllib.request.Request(self.endpoint()["health_url"])
        if not self.layout.secure:
            self._send(health, 3)
            return
        context = registry_secure.client_context(secure_material.material(self.layout))
        with urllib.request.urlopen(health, timeout=3, context=context):  # noqa: S310 - https only
            pass
        self._send(urllib.request.Request(self.address() + CCOMPAT + "/subjects"), 3)

    def verify(self) -> None:
        """Global compatibility BACKWARD (idempotent, every start)."""
        body = json.dumps({"compatibility": COMPATIBILITY}).encode()
        request = urllib.request.Request(self.address() + CCOMPAT + "/config", data=body, method="PUT",
                                         headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        try:
            self._send(request, 10)
        except Exception as e:  # noqa: BLE001 - whatever failed, the registry is not what the stack promises
            raise self.fail(f"setting compatibility {COMPATIBILITY} failed: {type(e).__name__}: {e}") from None
