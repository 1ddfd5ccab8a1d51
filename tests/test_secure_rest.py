"""The REST API locked down: real workers serving https with HTTP basic authentication, the CLI
against them, bad TLS material at start, and every credential a worker holds - from ``${file:}``
and ``${env:}`` providers, files and variables - kept out of its log, its responses and its metrics.

The TLS material is what ``eosink stack up --secure`` makes (its CA and a server certificate for
127.0.0.1), made here in a temporary home: the REST API is served by the worker itself, so these
tests need only the open stack's Kafka, ZooKeeper and PostgreSQL.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.procs import REPO, WorkerProcess, cluster_init, free_port, wait_until
from tests.restkit import produce

REST_USER = "eosink"
REST_PASSWORD = "rest-Pa55word-over-tls-0123"
KAFKA_SECRET = "kafka-Sasl-Pa55word-from-a-file-4567"
PG_SECRET = "pg-Connection-Pa55word-from-a-file-89ab"
ZK_SECRET = "zk-Digest-Pa55word-from-the-env-cdef"


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """The CA, server certificate and key a secure home holds (``eosink.worker.stack.secure``)."""
    from eosink.worker.stack import secure
    from eosink.worker.stack.layout import StackLayout

    return secure.ensure(StackLayout.for_home(tmp_path_factory.mktemp("secure-home"), secure=True))


@pytest.fixture(scope="module")
def secrets_file(tmp_path_factory) -> Path:
    """A properties file the ``${file:<path>:<key>}`` provider reads, mode 0600."""
    path = tmp_path_factory.mktemp("secrets") / "worker.properties"
    path.write_text(f"rest.password={REST_PASSWORD}\nkafka.password={KAFKA_SECRET}\npg.password={PG_SECRET}\n")
    path.chmod(0o600)
    return path


def https_call(url: str, method: str, path: str, body: Any = None, *, ca: Path | None, auth: tuple[str, str] | None = None,
               timeout: float = 30) -> tuple[int, Any]:
    """(status, parsed body) over https, verifying against ``ca``; never raises on an HTTP error status."""
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(), method=method,
                                 headers=headers)
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl.create_default_context()
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            text, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read(), exc.code
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text.decode(errors="replace")


def start_tls_worker(stack, cluster: str, worker_id: str, log_dir: Path, tls, **kw: Any) -> WorkerProcess:
    """A worker serving https with the secure home's server certificate, once ``/ready`` answers (no credentials)."""
    port = free_port()
    extra_args = ["--rest-tls-cert", str(tls.server_cert), "--rest-tls-key", str(tls.server_key), *kw.pop("extra_args", [])]
    w = WorkerProcess(stack, cluster, worker_id, log_dir, rest_port=port, extra_args=extra_args, **kw)
    w.url = f"https://127.0.0.1:{port}"

    def ready() -> bool:
        if w.proc.poll() is not None:
            raise AssertionError(f"worker {worker_id} exited with {w.proc.returncode}:\n{w.log_text()[-3000:]}")
        try:
            return https_call(w.url, "GET", "/ready", ca=tls.ca_cert, timeout=2)[0] == 200
        except OSError:
            return False

    wait_until(ready, 60, f"worker {worker_id} to serve https")
    return w


def stored_connectors(zk_hosts: str, cluster: str) -> list[str]:
    """What ZooKeeper holds, read past the REST API: a refused write must have changed nothing here."""
    from eosink.worker.control.store import ConnectorStore
    from eosink.worker.engine.zk import ZkSession

    session = ZkSession(zk_hosts, cluster).start()
    try:
        return sorted(ConnectorStore(session).names())
    finally:
        session.stop()


def _zk_digest(cluster: str, password: str) -> dict[str, str]:
    return {"EOSINK_ZOOKEEPER_USER": f"{cluster}-zk", "EOSINK_ZOOKEEPER_PASSWORD": password, "EOSINK_ZOOKEEPER_AUTH_SCHEME": "digest"}


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EOSINK_REST") and k != "EOSINK_URL"}
    return subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", *args], capture_output=True, text=True,
                          env={**base, **env}, cwd=REPO, timeout=60)


def _fs_config(tmp_path: Path, topic: str) -> dict[str, str]:
    return {"connector.class": "filesystem", "topics": topic, "file.path": str(tmp_path / "out")}


# -- authentication over TLS ------------------------------------------------------------------------------------------
def test_unauthenticated_and_wrong_password_writes_over_https_get_401_and_change_nothing(stack, unique, tmp_path, tls,
                                                                                           secrets_file):
    auth_file = tmp_path / "rest-basic-auth"
    auth_file.write_text(f"{REST_USER}:{REST_PASSWORD}\n")
    w = start_tls_worker(stack, unique, "w-tls", tmp_path, tls, extra_args=["--rest-basic-auth-file", str(auth_file)])
    good, wrong = (REST_USER, REST_PASSWORD), (REST_USER, "not-the-password")
    name = f"{unique}-c"
    body = {"name": name, "config": _fs_config(tmp_path, unique)}
    try:
        for auth in (None, wrong, ("someone-else", REST_PASSWORD)):
            assert https_call(w.url, "POST", "/connectors", body, ca=tls.ca_cert, auth=auth)[0] == 401, auth
            assert https_call(w.url, "PUT", f"/connectors/{name}/config", body["config"], ca=tls.ca_cert, auth=auth)[0] == 401
            assert https_call(w.url, "PUT", "/admin/loggers/eosink", {"level": "DEBUG"}, ca=tls.ca_cert, auth=auth)[0] == 401
            assert https_call(w.url, "GET", "/connectors", ca=tls.ca_cert, auth=auth)[0] == 401
        assert stored_connectors(stack.zookeeper_hosts, unique) == [], "a refused write reached ZooKeeper"
        assert https_call(w.url, "GET", "/admin/loggers/eosink", ca=tls.ca_cert, auth=good)[1]["level"] == "INFO"

        assert https_call(w.url, "POST", "/connectors", body, ca=tls.ca_cert, auth=good)[0] == 201
        assert https_call(w.url, "GET", "/connectors", ca=tls.ca_cert, auth=good) == (200, [name])
        assert stored_connectors(stack.zookeeper_hosts, unique) == [name]
        for auth in (None, wrong):
            assert https_call(w.url, "DELETE", f"/connectors/{name}", ca=tls.ca_cert, auth=auth)[0] == 401
            assert https_call(w.url, "PUT", f"/connectors/{name}/stop", ca=tls.ca_cert, auth=auth)[0] == 401
        assert stored_connectors(stack.zookeeper_hosts, unique) == [name], "a refused delete removed the connector"
        assert https_call(w.url, "GET", f"/connectors/{name}/status", ca=tls.ca_cert, auth=good)[1]["connector"]["state"] != "STOPPED"
        assert https_call(w.url, "DELETE", f"/connectors/{name}", ca=tls.ca_cert, auth=good)[0] == 204
        assert stored_connectors(stack.zookeeper_hosts, unique) == []

        assert https_call(w.url, "GET", "/health", ca=tls.ca_cert)[0] == 200, "probes carry no credentials"
        assert https_call(w.url, "GET", "/ready", ca=tls.ca_cert)[0] == 200
        with pytest.raises(OSError):  # nothing is served in clear text on the TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{w.rest_port}/health", timeout=5).read()
        with pytest.raises(urllib.error.URLError) as e:  # and the server's certificate is not trusted without the CA
            https_call(w.url, "GET", "/health", ca=None)
        assert isinstance(e.value.reason, ssl.SSLCertVerificationError)
        # the worker image's HEALTHCHECK, with the image's variables, probes the https port too
        probe = json.loads(re.search(r"HEALTHCHECK .*?CMD (\[[^\n]*\])", (REPO / "docker" / "worker.Dockerfile").read_text(),
                                     re.S).group(1))
        base = {k: v for k, v in os.environ.items() if not k.startswith("EOSINK_")}
        env = {**base, "EOSINK_REST_PORT": str(w.rest_port), "EOSINK_REST_TLS_CERT": str(tls.server_cert)}
        assert subprocess.run([sys.executable, *probe[1:]], env=env, capture_output=True, timeout=10).returncode == 0
        env.pop("EOSINK_REST_TLS_CERT")
        assert subprocess.run([sys.executable, *probe[1:]], env=env, capture_output=True, timeout=10).returncode != 0
    finally:
        w.stop()
    log = w.log_path.read_text()
    assert '"scheme": "https"' in log and '"rest_url": "https://' in log, log[-2000:]
    assert REST_PASSWORD not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_a_tls_connection_below_tls_1_2_is_refused_by_the_server(stack, unique, tmp_path, tls):
    w = start_tls_worker(stack, unique, "w-tls-old", tmp_path, tls)
    try:
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.load_verify_locations(str(tls.ca_cert))
        old.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1 at all: the server must say no
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises(urllib.error.URLError) as e:
            urllib.request.urlopen(f"{w.url}/health", timeout=5, context=old).read()
        # the server's alert, not this client refusing on its own (that would be NO_PROTOCOLS_AVAILABLE)
        assert isinstance(e.value.reason, ssl.SSLError) and e.value.reason.reason == "TLSV1_ALERT_PROTOCOL_VERSION", e.value
        new = ssl.create_default_context(cafile=str(tls.ca_cert))
        with urllib.request.urlopen(f"{w.url}/health", timeout=5, context=new) as r:
            assert r.status == 200
    finally:
        w.stop()


def test_a_client_that_connects_and_never_handshakes_does_not_stall_other_https_requests(stack, unique, tmp_path, tls):
    w = start_tls_worker(stack, unique, "w-tls-silent", tmp_path, tls)
    silent = [socket.create_connection(("127.0.0.1", w.rest_port)) for _ in range(3)]  # TCP only: no ClientHello, ever
    try:
        started = time.monotonic()
        assert https_call(w.url, "GET", "/health", ca=tls.ca_cert, timeout=10)[0] == 200
        assert time.monotonic() - started < 5, "the silent clients held up the server"
    finally:
        for s in silent:
            s.close()
        w.stop()
    assert "Traceback" not in w.log_path.read_text()


# -- the CLI over https -----------------------------------------------------------------------------------------------
def test_cli_works_over_https_with_rest_ca_and_fails_in_one_line_without_it_or_with_a_wrong_password(stack, unique, tmp_path,
                                                                                                   tls, secrets_file):
    reference = f"{REST_USER}:${{file:{secrets_file}:rest.password}}"
    w = start_tls_worker(stack, unique, "w-cli", tmp_path, tls, extra_env={"EOSINK_REST_BASIC_AUTH": reference})
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"name": f"{unique}-c", "config": _fs_config(tmp_path, unique)}))
    auth_file = tmp_path / "cli-auth"
    auth_file.write_text(f"{REST_USER}:{REST_PASSWORD}\n")
    try:
        env = {"EOSINK_URL": w.url, "EOSINK_REST_CA": str(tls.ca_cert), "EOSINK_REST_BASIC_AUTH_FILE": str(auth_file)}
        r = cli("connectors", "apply", str(config), env=env)
        assert r.returncode == 0 and f"created connector {unique}-c" in r.stdout, r.stderr
        r = cli("connectors", "--rest-ca", str(tls.ca_cert), "--basic-auth", reference, "--url", w.url, "list",
                env={})  # the password as a ${file:} reference on the command line: ps shows the reference only
        assert r.returncode == 0 and r.stdout.split() == [f"{unique}-c"], r.stderr

        r = cli("connectors", "list", env={k: v for k, v in env.items() if k != "EOSINK_REST_CA"})
        line = r.stderr.strip()
        assert r.returncode == 2 and len(line.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "--rest-ca / EOSINK_REST_CA" in line and w.url in line and "certificate" in line, line

        bad = tmp_path / "wrong-auth"
        bad.write_text(f"{REST_USER}:not-the-password\n")
        r = cli("connectors", "delete", f"{unique}-c", env={**env, "EOSINK_REST_BASIC_AUTH_FILE": str(bad)})
        line = r.stderr.strip()
        assert r.returncode == 2 and len(line.splitlines()) == 1 and "HTTP 401" in line, r.stderr
        assert "--basic-auth-file / EOSINK_REST_BASIC_AUTH_FILE" in line and "not-the-password" not in line, line

        r = cli("connectors", "delete", f"{unique}-c", env={k: v for k, v in env.items() if "AUTH" not in k})
        assert r.returncode == 2 and "HTTP 401" in r.stderr and "EOSINK_REST_BASIC_AUTH" in r.stderr, r.stderr
        assert stored_connectors(stack.zookeeper_hosts, unique) == [f"{unique}-c"], "a refused delete changed ZooKeeper"
    finally:
        w.stop()


# -- bad TLS material at start ----------------------------------------------------------------------------------------
BAD_TLS = {  # case -> (cert, key, the setting the line must name, the file it must name); "" = not given
    "cert missing": ("{tmp}/absent.pem", "{key}", "--rest-tls-cert", "{tmp}/absent.pem"),
    "cert not a certificate": ("{key}", "{key}", "--rest-tls-cert", "{key}"),
    "key missing": ("{cert}", "{tmp}/absent.key", "--rest-tls-key", "{tmp}/absent.key"),
    "key of another certificate": ("{cert}", "{ca_key}", "--rest-tls-key", "{ca_key}"),
    "key not a key": ("{cert}", "{ca}", "--rest-tls-key", "{ca}"),
    "key not given": ("{cert}", "", "--rest-tls-key", ""),
}


@pytest.mark.parametrize("case", sorted(BAD_TLS))
def test_bad_tls_certificate_or_key_stops_the_worker_at_start_with_one_line_naming_the_setting_and_file(case, tmp_path, tls):
    places = {"tmp": tmp_path, "cert": tls.server_cert, "key": tls.server_key, "ca_key": tls.ca_key, "ca": tls.ca_cert}
    cert, key, setting, named = (v.format(**places) for v in BAD_TLS[case])
    args = ["worker", "--bootstrap-servers", "127.0.0.1:9", "--zookeeper", "127.0.0.1:9", "--rest-port", str(free_port()),
            "--rest-tls-cert", cert, *(["--rest-tls-key", key] if key else [])]
    r = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", *args], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={k: v for k, v in os.environ.items() if not k.startswith("EOSINK_REST")})
    line = r.stderr.strip()
    assert r.returncode == 2 and len(line.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert setting in line and named in line, line


@pytest.mark.parametrize("args, named", [
    (["--kafka-property", "sasl.password=${file:{tmp}/absent.properties:kafka.password}"], "--kafka-property sasl.password"),
    (["--kafka-property", "sasl.password=${env:EOSINK_TEST_UNSET_VARIABLE}"], "EOSINK_TEST_UNSET_VARIABLE"),
    (["--rest-basic-auth-file", "{tmp}/absent"], "--rest-basic-auth-file / EOSINK_REST_BASIC_AUTH_FILE"),
    (["--rest-basic-auth", "eosink:${file:{tmp}/creds:nokey}"], "--rest-basic-auth / EOSINK_REST_BASIC_AUTH"),
    (["--rest-basic-auth", "eosink:pw", "--rest-basic-auth-file", "{tmp}/creds"], "not both"),
])
def test_a_worker_secret_that_cannot_be_resolved_stops_the_start_with_one_line_naming_the_setting(args, named, tmp_path):
    (tmp_path / "creds").write_text("other=x\n")
    argv = ["worker", "--bootstrap-servers", "127.0.0.1:9", "--zookeeper", "127.0.0.1:9", "--rest-port", str(free_port()),
            *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    r = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", *argv], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={k: v for k, v in os.environ.items() if not k.startswith(("EOSINK_REST", "EOSINK_KAFKA_"))})
    line = r.stderr.strip()
    assert r.returncode == 2 and len(line.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert named in line, line


# -- secrets from providers never shown ------------------------------------------------------------------------------
def test_provider_secrets_never_reach_the_log_status_configs_metrics_command_line_or_a_trace(stack, unique, tmp_path, tls,
                                                                                               secrets_file, make_topic):
    """The REST password (``${file:}`` in EOSINK_REST_BASIC_AUTH), Kafka's sasl.password (``--kafka-property`` with a
    ``${file:}`` reference), a ZooKeeper password in EOSINK_ZOOKEEPER_PASSWORD and a connector's connection.password
    (``${file:}``, resolved by the worker; one connector also quotes it in a failing DSN, so its trace holds it)."""
    topic = make_topic(1)
    metrics_port = free_port()
    init = cluster_init(unique, _zk_digest(unique, ZK_SECRET))  # the open stack's ZooKeeper has no SASL users: digest
    assert init.returncode == 0, init.stderr
    w = start_tls_worker(
        stack, unique, "w-secrets", tmp_path, tls, metrics_port=metrics_port,
        extra_args=["--kafka-property", f"sasl.password=${{file:{secrets_file}:kafka.password}}"],
        extra_env={"EOSINK_REST_BASIC_AUTH": f"{REST_USER}:${{file:{secrets_file}:rest.password}}",
                   **_zk_digest(unique, ZK_SECRET)},
    )
    good = (REST_USER, REST_PASSWORD)
    ref = f"${{file:{secrets_file}:pg.password}}"
    ok = {"connector.class": "postgres", "topics": topic, "connection.url": stack.postgres_dsn, "table.name.format": unique,
          "connection.password": ref, "commit.interval.ms": "200"}
    leaky = {"connector.class": "postgres", "topics": topic, "connection.url": ref, "connection.password": ref}
    seen: list[str] = []
    try:
        for n, c in ((f"{unique}-ok", ok), (f"{unique}-leaky", leaky)):
            status, body = https_call(w.url, "POST", "/connectors", {"name": n, "config": c}, ca=tls.ca_cert, auth=good)
            assert status == 201, body
            seen.append(json.dumps(body))
        produce(stack.kafka_bootstrap, topic, [(0, b'{"id": "x"}')])
        leak = f"/connectors/{unique}-leaky"
        wait_until(lambda: https_call(w.url, "GET", f"{leak}/status", ca=tls.ca_cert, auth=good)[1]["connector"]["state"]
                   == "FAILED", 60, "the leaky connector to fail")
        wait_until(lambda: [t["state"] for t in https_call(w.url, "GET", f"/connectors/{unique}-ok/status", ca=tls.ca_cert,
                                                           auth=good)[1]["tasks"]] == ["RUNNING"], 60, "the good connector to run")
        for path in ("/connectors?expand=info&expand=status", f"/connectors/{unique}-ok/config", f"{leak}/config", leak,
                     f"{leak}/status", f"{leak}/tasks", f"/connectors/{unique}-ok/status", "/metrics", "/", "/admin/loggers"):
            status, body = https_call(w.url, "GET", path, ca=tls.ca_cert, auth=good)
            assert status == 200, (path, body)
            seen.append(body if isinstance(body, str) else json.dumps(body))
        trace = json.dumps(https_call(w.url, "GET", f"{leak}/status", ca=tls.ca_cert, auth=good)[1])
        assert "[hidden]" in trace, trace  # the failure quoted the resolved DSN: shown redacted
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            seen.append(r.read().decode())
        seen.append(Path(f"/proc/{w.proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        config = https_call(w.url, "GET", f"/connectors/{unique}-ok/config", ca=tls.ca_cert, auth=good)[1]
        assert config["connection.password"] == "[hidden]", config
    finally:
        w.stop()
    seen.append(w.log_path.read_text())
    assert "connector_started" in seen[-1] and "[hidden]" in seen[-1], seen[-1][-3000:]  # the failure was logged, redacted
    for secret in (REST_PASSWORD, KAFKA_SECRET, PG_SECRET, ZK_SECRET):
        leaked = [s[max(0, s.find(secret) - 200):s.find(secret) + 50] for s in seen if secret in s]
        assert not leaked, f"{secret} leaked: {leaked}"


def test_library_log_records_and_uncaught_exception_traces_in_a_worker_process_are_redacted():
    """What bypasses our structured logger - a library's stdlib logging (kazoo, urllib3), an exception escaping a
    thread or the main thread - goes through the redactor once the worker installed its process hooks; a credential
    given in an ``EOSINK_*PASSWORD`` variable is hidden even before any code reads it."""
    code = f"""
import logging, threading
from eosink.worker.logging import configure, install_process_hooks, register_environment_secrets, register_secret
configure("INFO", json=True)
install_process_hooks()
register_environment_secrets()  # as the worker does at start: EOSINK_ZOOKEEPER_PASSWORD is read by no code here
register_secret({PG_SECRET!r})
logging.getLogger("kazoo.client").warning("connecting with the digest eosink:%s", {ZK_SECRET!r})
def task():
    raise RuntimeError("connection failed: password={PG_SECRET}")
t = threading.Thread(target=task, name="task-x")
t.start()
t.join()
raise ValueError("at exit: {PG_SECRET}")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "EOSINK_ZOOKEEPER_PASSWORD": ZK_SECRET})
    assert r.returncode == 1, r.stderr
    assert PG_SECRET not in r.stderr and ZK_SECRET not in r.stderr, r.stderr
    assert "connecting with the digest eosink:[hidden]" in r.stderr, r.stderr
    events = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    uncaught = [e for e in events if e["event"] == "uncaught_exception"]
    assert [e.get("thread") for e in uncaught] == ["task-x", None], r.stderr
    assert all("[hidden]" in e["exception"] for e in uncaught), uncaught
