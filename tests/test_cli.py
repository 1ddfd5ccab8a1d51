"""``eosink connectors ...`` and ``eosink worker`` flags, against real workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import REPO, wait_until
from tests.restkit import call, pg_ids, produce, start_worker

pytestmark = pytest.mark.chaos


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EOSINK_REST") and k != "EOSINK_URL"}
    return subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env={**base, **(env or {})})


@pytest.fixture
def worker(stack, unique, tmp_path):
    w = start_worker(stack, unique, "w-cli", tmp_path)
    yield w
    w.stop()


def _write(path: Path, name: str, config: dict) -> Path:
    path.write_text(json.dumps({"name": name, "config": config}))
    return path


def test_apply_creates_then_updates_idempotently_from_files_and_directories(worker, tmp_path):
    confs = tmp_path / "configs"
    confs.mkdir()
    for n in ("a", "b"):
        _write(confs / f"{n}.json", f"fs-{n}", {"connector.class": "filesystem", "topics": "t-none", "file.path": str(tmp_path)})
    r = cli("connectors", "--url", worker.url, "apply", str(confs))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["created connector fs-a", "created connector fs-b"]
    r = cli("connectors", "--url", worker.url, "apply", str(confs / "a.json"), str(confs / "b.json"))
    assert r.returncode == 0 and r.stdout.splitlines() == ["updated connector fs-a", "updated connector fs-b"], r.stderr
    assert call(worker.url, "GET", "/connectors")[1] == ["fs-a", "fs-b"]
    assert cli("connectors", "--url", worker.url, "list").stdout.split() == ["fs-a", "fs-b"]
    # all files are validated before anything is written
    _write(confs / "c.json", "fs-c", {"connector.class": "filesystem", "topics": "t-none", "file.path": str(tmp_path)})
    _write(confs / "d.json", "fs-d", {"connector.class": "filesystem", "file.path": str(tmp_path)})
    r = cli("connectors", "--url", worker.url, "apply", str(confs))
    assert r.returncode == 2 and "d.json" in r.stderr and "key 'topics'" in r.stderr and "Traceback" not in r.stderr
    assert call(worker.url, "GET", "/connectors/fs-c")[0] == 404


def test_status_watch_shows_per_partition_lag_and_delivered_counts(worker, stack, make_topic, unique, pg, tmp_path):
    topic = make_topic(2)
    _write(tmp_path / "c.json", unique, {"connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
                                         "table.name.format": unique, "commit.interval.ms": "200"})
    assert cli("connectors", "--url", worker.url, "apply", str(tmp_path / "c.json")).returncode == 0
    produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": f"r{i}"}).encode()) for i in range(50)])
    wait_until(lambda: len(pg_ids(pg, unique)) == 50, 60, "50 rows")
    def both_delivered() -> bool:  # the status is published per change: wait for both partitions' counts
        lines = cli("connectors", "--url", worker.url, "status", unique).stdout.splitlines()
        return all(any(f"{topic}-{p} " in ln and ln.split()[3:4] == ["25"] for ln in lines) for p in (0, 1))

    wait_until(both_delivered, 30, "delivered counts of both partitions")
    r = cli("connectors", "--url", worker.url, "status", unique, "--watch", "--interval", "0.3", "--count", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"{unique}: RUNNING") == 2, r.stdout
    for p in (0, 1):
        line = next(ln for ln in r.stdout.splitlines() if f"{topic}-{p} " in ln)
        epoch, lag, delivered = line.split()[1:4]
        assert int(epoch) >= 1 and delivered == "25" and lag in ("-", "0", "1"), line
    as_json = json.loads(cli("connectors", "--url", worker.url, "status", unique, "--json").stdout)
    assert as_json["connector"]["state"] == "RUNNING"


def test_lifecycle_commands_pause_resume_stop_offsets_restart_and_delete(worker, stack, make_topic, unique, pg, tmp_path):
    topic = make_topic(1)
    name = unique
    _write(tmp_path / "c.json", name, {"connector.class": "postgres", "topics": topic, "connection.url": stack.postgres_dsn,
                                       "table.name.format": unique, "commit.interval.ms": "200"})
    url = ["connectors", "--url", worker.url]
    assert cli(*url, "apply", str(tmp_path / "c.json")).returncode == 0
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": f"r{i}"}).encode()) for i in range(10)])
    wait_until(lambda: len(pg_ids(pg, unique)) == 10, 60, "10 rows")
    assert cli(*url, "pause", name).stdout.strip() == f"pause requested for connector {name}"
    wait_until(lambda: f"{name}: PAUSED" in cli(*url, "status", name).stdout, 30, "PAUSED")
    assert cli(*url, "resume", name).returncode == 0
    wait_until(lambda: f"{name}: RUNNING" in cli(*url, "status", name).stdout, 30, "RUNNING")
    assert cli(*url, "offsets", name).stdout.split() == [topic, "0", "10"]
    r = cli(*url, "offsets", name, "--set", f"{topic}:0=5")
    assert r.returncode == 2 and "STOPPED" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert cli(*url, "stop", name).returncode == 0
    wait_until(lambda: call(worker.url, "GET", f"/connectors/{name}/status")[1]["tasks"] == [], 30, "tasks to stop")
    r = cli(*url, "offsets", name, "--set", f"{topic}:0=5")
    assert r.returncode == 0 and "altered successfully" in r.stdout, r.stderr
    assert cli(*url, "offsets", name).stdout.split() == [topic, "0", "5"]
    assert "reset successfully" in cli(*url, "offsets", name, "--reset").stdout
    assert cli(*url, "offsets", name).stdout.strip() == ""
    assert cli(*url, "transactions", name).stdout.strip() == "no prepared transactions"
    assert cli(*url, "resume", name).returncode == 0
    wait_until(lambda: len(pg_ids(pg, unique)) == 20, 60, "redelivery from the earliest offset after the reset")
    r = cli(*url, "restart", name, "--include-tasks")
    assert r.returncode == 0 and r.stdout.startswith(f"restart requested for connector {name}: tasks [0]"), r.stdout
    assert cli(*url, "delete", name).stdout.strip() == f"deleted connector {name}"
    r = cli(*url, "status", name)
    assert r.returncode == 2 and f"Connector {name} not found" in r.stderr and "HTTP 404" in r.stderr


def test_cli_errors_are_one_line_without_a_traceback(tmp_path):
    r = cli("connectors", "--url", "http://127.0.0.1:9", "list")
    assert r.returncode == 2 and "cannot reach the worker at http://127.0.0.1:9" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("connectors", "--url", "http://127.0.0.1:9", "apply", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "missing.json" in r.stderr and "Traceback" not in r.stderr
    r = cli("worker", "--bootstrap-servers", "x:1", "--zookeeper", "x:2", "--kafka-property", "nonsense")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr and "Traceback" not in r.stderr


BAD_SETTINGS = [  # (argv, environment, the name the error must give, the value it must quote)
    (["worker"], {"EOSINK_SESSION_TIMEOUT": "ten"}, "EOSINK_SESSION_TIMEOUT", "ten"),
    (["worker", "--session-timeout", "0"], {}, "--session-timeout", "0"),
    (["worker"], {"EOSINK_REST_PORT": "80a"}, "EOSINK_REST_PORT", "80a"),
    (["worker", "--metrics-port", "70000"], {}, "--metrics-port", "70000"),
    (["worker"], {"EOSINK_METRICS_PORT": "-1"}, "EOSINK_METRICS_PORT", "-1"),
    (["worker"], {"EOSINK_REST_ADVERTISED_URL": "worker-1:8083"}, "EOSINK_REST_ADVERTISED_URL", "worker-1:8083"),
    (["worker"], {"EOSINK_BOOTSTRAP_SERVERS": "kafka"}, "EOSINK_BOOTSTRAP_SERVERS", "kafka"),
    (["worker", "--zookeeper", "zk:port"], {}, "--zookeeper", "zk:port"),
    (["worker", "--cluster", "two words"], {}, "--cluster", "two words"),
    (["worker", "--log-level", "LOUD"], {}, "--log-level", "LOUD"),
    (["worker", "--kafka-property", "nonsense"], {}, "--kafka-property", "nonsense"),
    (["connectors", "list"], {"EOSINK_URL": "localhost:8083"}, "EOSINK_URL", "localhost:8083"),
    (["connectors", "--url", "ftp://w:1", "list"], {}, "--url", "ftp://w:1"),
    (["connectors", "--url", "http://w:port", "list"], {}, "--url", "http://w:port"),
    (["connectors", "--url", "http://127.0.0.1:9", "status", "c", "--watch", "--interval", "soon"], {}, "--interval", "soon"),
    (["connectors", "--url", "http://127.0.0.1:9", "status", "--watch", "--count", "-1"], {}, "--count", "-1"),
    (["connectors", "--url", "http://127.0.0.1:9", "offsets", "c", "--set", "t=1"], {}, "--set", "t=1"),
    (["connectors", "list"], {"EOSINK_LOG_LEVEL": "LOUD"}, "EOSINK_LOG_LEVEL", "LOUD"),
    (["connectors", "list"], {"EOSINK_LOG_FORMAT": "xml"}, "EOSINK_LOG_FORMAT", "xml"),
]


@pytest.mark.parametrize("argv, env, name, value", BAD_SETTINGS, ids=[f"{c[2]}={c[3]}" for c in BAD_SETTINGS])
def test_a_bad_flag_or_variable_is_one_line_naming_it_and_its_value_exit_2(argv, env, name, value):
    r = cli(*argv, env=env, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{name}={value!r}: expected " in r.stderr, r.stderr


def test_a_malformed_credential_is_named_but_never_echoed():
    r = cli("worker", env={"EOSINK_REST_BASIC_AUTH": "admin-no-colon-s3cret"})
    assert r.returncode == 2 and "EOSINK_REST_BASIC_AUTH" in r.stderr and "USER:PASSWORD" in r.stderr, r.stderr
    assert "s3cret" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_worker_variable_is_read_only_by_the_worker_and_durations_take_units():
    from eosink.worker.clients.typed import DURATION, read

    r = cli("connectors", "--url", "http://127.0.0.1:9", "list", env={"EOSINK_SESSION_TIMEOUT": "ten"})
    assert r.returncode == 2 and "cannot reach the worker" in r.stderr and "EOSINK_SESSION_TIMEOUT" not in r.stderr
    assert [read(DURATION, v, "x") for v in ("10", "10s", "2.5", "500ms", "2m")] == [10, 10, 2.5, 0.5, 120]


def test_an_unknown_subcommand_is_one_line_pointing_at_help():
    r = cli("frobnicate")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "eosink --help" in r.stderr, r.stderr
    assert cli("--version").stdout.startswith("eosink ")


def test_cli_takes_credentials_from_the_same_environment_as_the_worker(stack, unique, tmp_path):
    env = {"EOSINK_REST_TOKEN": "t0ken-for-cli"}
    w = start_worker(stack, unique, "w-cli-auth", tmp_path, extra_env=env)
    try:
        r = cli("connectors", "--url", w.url, "list")
        assert r.returncode == 2 and "HTTP 401" in r.stderr
        assert cli("connectors", "--url", w.url, "list", env=env).returncode == 0
        assert cli("connectors", "--url", w.url, "--token", "t0ken-for-cli", "list").returncode == 0
        r = cli("connectors", "list", env={**env, "EOSINK_URL": w.url})
        assert r.returncode == 0, r.stderr
    finally:
        w.stop()


def test_direct_mode_writes_zookeeper_for_bootstrapping(stack, unique, tmp_path, zk):
    path = _write(tmp_path / "c.json", "direct", {"connector.class": "filesystem", "topics": "t", "file.path": str(tmp_path)})
    direct = ["connectors", "--zookeeper", stack.zookeeper_hosts, "--cluster", unique]
    assert cli(*direct, "apply", str(path)).stdout.strip() == "created connector direct"
    assert json.loads(zk.get(f"/eosink/{unique}/connectors/direct/config")[0])["topics"] == "t"
    assert cli(*direct, "list").stdout.split() == ["direct"]
    r = cli(*direct, "status")
    assert r.returncode == 2 and "needs a worker" in r.stderr
    assert cli(*direct, "delete", "direct").returncode == 0 and not zk.exists(f"/eosink/{unique}/connectors/direct")


def test_kafka_security_settings_come_from_flags_and_EOSINK_KAFKA_variables():
    from eosink.worker.clients.cli import kafka_settings

    env = {"EOSINK_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "EOSINK_KAFKA_SASL_MECHANISM": "PLAIN",
           "EOSINK_KAFKA_SASL_USERNAME": "u", "EOSINK_KAFKA_SSL_CA_LOCATION": "/ca.pem", "EOSINK_KAFKA_LINGER_MS": "5"}
    assert kafka_settings(["sasl.password=p", "client.id=x"], env) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "ssl.ca.location": "/ca.pem",
        "sasl.password": "p", "client.id": "x"}


def test_generated_configuration_docs_are_up_to_date():
    from eosink.worker.control.config_docs import stale_pages

    assert stale_pages(REPO / "docs") == [], \
        "generated configuration pages are stale: regenerate with `eosink connectors plugins --write-docs docs`"
    doc = REPO / "docs" / "configuration.md"
    for key in ("errors.tolerance", "errors.deadletterqueue.topic.name", "connection.password", "file.path", "tasks.max"):
        assert f"`{key}`" in doc.read_text()
    assert "`pk.mode`" in (REPO / "docs" / "connectors" / "postgres.md").read_text()


def test_a_connector_page_whose_generated_block_is_edited_by_hand_is_stale(tmp_path):
    import shutil

    from eosink.worker.control.config_docs import stale_pages, write_docs

    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    page = docs / "connectors" / "s3.md"
    page.write_text(page.read_text().replace("`s3.bucket.name`", "`s3.bucket`", 1))
    assert stale_pages(docs) == [str(page)]
    assert write_docs(docs) == [str(page)]
    assert stale_pages(docs) == []
