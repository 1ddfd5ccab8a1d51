"""The alerting an operator deploys (docker/observability/), proven with a real Prometheus.

* ``promtool test rules`` passes, and it shows every alert both firing and not firing;
* every metric the Grafana dashboard queries is exported by a real worker;
* Prometheus built from its Go module scrapes a three-worker cluster with the shipped rules
  (``for:`` shortened by rewriting, one source of truth) and fires EosinkTaskFailed for a failed
  task and EosinkWorkerDown for a killed worker, and nothing while the cluster is healthy;
* the Go build cache (:mod:`eosink.worker.stack.gotools`) and Maven's progress lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.procs import free_port, publish, register, wait_until
from tests.restkit import call, produce, start_worker

OBS = Path(__file__).resolve().parent.parent / "docker" / "observability"
SESSION = 4.0


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load((OBS / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    doc = json.loads((OBS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if v.get("definition")]
    return exprs


def _exported_names(metrics_text: str) -> set[str]:
    """Every sample name a worker can export: families from HELP/TYPE (labelled counters and
    histograms are declared before their first sample), with a histogram's suffixes."""
    names: set[str] = set()
    for line in metrics_text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            name, kind = m.groups()
            names.add(name)
            if kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            if kind == "histogram":
                names.update(f"{name}{s}" for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _pg_config(topic: str, table: str, **extra: str) -> dict[str, str]:
    return {"connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": table, "commit.interval.ms": "250", **extra}


# -- the rules ----------------------------------------------------------------------------------------
def test_promtool_unit_tests_show_every_alert_firing_and_not_firing():
    from eosink.worker.stack.prometheus import promtool_test_rules

    done = promtool_test_rules()
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    tests = yaml.safe_load((OBS / "alerts_test.yml").read_text())["tests"]
    checks = [c for t in tests for c in t.get("alert_rule_test", [])]
    for rule in _rules():
        mine = [c for c in checks if c["alertname"] == rule["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{rule['alert']} is never shown firing"
        assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']} is never shown not firing"


def test_promtool_unit_tests_fail_when_a_threshold_changes(tmp_path):
    """The unit tests pin the rules: a changed threshold is caught."""
    from eosink.worker.stack.prometheus import promtool_test_rules

    text = (OBS / "alerts.yml").read_text()
    assert "> 600" in text
    (tmp_path / "alerts.yml").write_text(text.replace("> 600", "> 900"))
    (tmp_path / "alerts_test.yml").write_text((OBS / "alerts_test.yml").read_text())
    done = promtool_test_rules(tmp_path / "alerts_test.yml")
    assert done.returncode != 0 and "EosinkPreparedUnresolved" in done.stdout + done.stderr


def test_shortened_rules_change_only_for_durations():
    from eosink.worker.stack.prometheus import rules_with_for

    original = (OBS / "alerts.yml").read_text()
    short = yaml.safe_load(rules_with_for(original, "3s"))
    long = yaml.safe_load(original)
    for a, b in zip(long["groups"][0]["rules"], short["groups"][0]["rules"], strict=True):
        assert {k: v for k, v in a.items() if k != "for"} == {k: v for k, v in b.items() if k != "for"}
        assert b.get("for") == ("3s" if "for" in a else None), b["alert"]
    with pytest.raises(ValueError, match="3 minutes"):
        rules_with_for(original, "3 minutes")


# -- the dashboard ------------------------------------------------------------------------------------
def test_dashboard_queries_only_metrics_a_real_worker_exports(stack, unique, make_topic, pg, tmp_path):
    topic = make_topic(2)
    name = unique.replace("_", "-")
    w = start_worker(stack, unique, "w-dash", tmp_path, session_timeout=SESSION)
    try:
        assert call(w.url, "POST", "/connectors", {"name": name, "config": _pg_config(topic, unique)})[0] == 201
        produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": f"r{i}"}).encode()) for i in range(10)])
        wait_until(lambda: f'eosink_records_delivered_total{{connector="{name}"}} 10.0'
                   in urllib.request.urlopen(f"{w.url}/metrics", timeout=5).read().decode(), 60, "delivery of 10 records")
        exported = _exported_names(urllib.request.urlopen(f"{w.url}/metrics", timeout=5).read().decode())
    finally:
        w.stop()
    used = {m for e in _dashboard_exprs() for m in re.findall(r"\beosink_[a-z_]+\b", e)}
    missing = sorted(used - exported)
    assert not missing, f"the dashboard queries metrics no worker exports: {missing}"
    for needed in ("eosink_task_failed", "eosink_consumer_lag", "eosink_seconds_since_last_commit",
                   "eosink_records_delivered_total", "eosink_records_consumed_total", "eosink_cycle_duration_seconds_bucket",
                   "eosink_fenced_attempts_total", "eosink_stale_batches_total", "eosink_recovered_txns_total",
                   "eosink_prepared_unresolved", "eosink_prepared_unresolved_age_seconds"):
        assert needed in used, f"no dashboard panel shows {needed}"
    rule_metrics = {m for r in _rules() for m in re.findall(r"\beosink_[a-z_]+\b", r["expr"])}
    assert not rule_metrics - exported, f"the alert rules query metrics no worker exports: {sorted(rule_metrics - exported)}"


# -- a real Prometheus over a three-worker cluster ------------------------------------------------------
def test_prometheus_fires_task_failed_and_worker_down_on_a_three_worker_cluster(stack, unique, make_topic, pg, tmp_path):
    from eosink.worker.stack.prometheus import LocalPrometheus

    topic = make_topic(6)
    name = unique.replace("_", "-")
    register(stack.zookeeper_hosts, unique, name, _pg_config(topic, unique, **{"tasks.max": "3"}))
    workers = [start_worker(stack, unique, f"w{i}", tmp_path, session_timeout=SESSION) for i in (1, 2, 3)]
    targets = {w.worker_id: w.url.removeprefix("http://") for w in workers}
    prom = LocalPrometheus(tmp_path / "prometheus", list(targets.values()), free_port(), interval="1s", alert_for="3s")
    try:
        prom.start()
        publish(stack.kafka_bootstrap, topic, 6, txns=2, per_txn=60)
        wait_until(lambda: prom.targets_up() == dict.fromkeys(targets.values(), True), 30, "all three workers scraped up")
        wait_until(lambda: [r["value"][1] for r in prom.query(f'sum(eosink_assigned_partitions{{connector="{name}"}})')]
                   == ["6"], 60,
                   "the 6 partitions assigned, as Prometheus sees them")
        time.sleep(5)  # longer than every shortened for: a healthy cluster fires nothing
        assert prom.alerts("firing") == [], prom.alerts("firing")
        assert [r["value"][1] for r in prom.query("sum(eosink_leader)")] == ["1"]
        for expr in {e.replace("$connector", ".*").replace("$__rate_interval", "1m") for e in _dashboard_exprs()}:
            if not expr.startswith("label_values"):
                prom.query(expr)  # valid PromQL: raises on a query error

        bad_topic, bad = make_topic(1), f"{name}-bad"
        pg.execute(f'CREATE TABLE "{unique}_bad" (id text, payload bigint)')
        produce(stack.kafka_bootstrap, bad_topic, [(0, json.dumps({"id": "x", "payload": "not a number"}).encode())])
        assert call(workers[0].url, "POST", "/connectors",
                    {"name": bad, "config": _pg_config(bad_topic, f"{unique}_bad")})[0] == 201

        def fired(alert: str, **labels: str) -> bool:
            return any(a["labels"]["alertname"] == alert and all(a["labels"].get(k) == v for k, v in labels.items())
                       for a in prom.alerts("firing"))

        wait_until(lambda: fired("EosinkTaskFailed", connector=bad), 60, f"EosinkTaskFailed for {bad}")
        assert not fired("EosinkTaskFailed", connector=name), "the healthy connector is not reported"

        victim = workers[1]
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        wait_until(lambda: fired("EosinkWorkerDown", instance=targets[victim.worker_id]), 30,
                   f"EosinkWorkerDown for {targets[victim.worker_id]}")
        assert not fired("EosinkWorkerDown", instance=targets[workers[0].worker_id])
        query = f'sum(eosink_assigned_partitions{{connector="{name}"}})'
        wait_until(lambda: [r["value"][1] for r in prom.query(query)] == ["6"]
                   and len(prom.query(f'eosink_assigned_partitions{{connector="{name}"}} > 0')) == 2, SESSION + 30,
                   "the killed worker's partitions taken over by the two others, as Prometheus sees them")
    finally:
        prom.stop()
        for w in workers:
            w.stop()


# -- Go binaries and Maven progress -------------------------------------------------------------------
def test_go_binary_without_go_names_go_the_module_and_the_cache(tmp_path, monkeypatch):
    from eosink.worker.stack.errors import ComponentError
    from eosink.worker.stack.gotools import go_binary

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ComponentError) as e:
        go_binary("github.com/prometheus/prometheus", "v0.316.0", ["prometheus", "promtool"])
    text = str(e.value)
    assert "`go`" in text and "Go" in text and "github.com/prometheus/prometheus" in text, text
    assert str(tmp_path / "cache" / "eosink" / "prometheus" / "v0.316.0") in text, text


def test_go_binary_uses_the_cache_layout_and_needs_no_go_once_built(tmp_path, monkeypatch):
    from eosink.worker.stack.gotools import go_binary, package_of

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    built = tmp_path / "eosink" / "minio" / "v1"
    built.mkdir(parents=True)
    (built / "minio").write_text("#!/bin/sh\n")
    (built / "minio").chmod(0o755)
    assert go_binary("github.com/minio/minio", "v1", ["minio"]) == {"minio": built / "minio"}
    assert package_of("github.com/minio/minio", "minio", root="minio") == "github.com/minio/minio"
    assert package_of("github.com/prometheus/prometheus", "promtool") == "github.com/prometheus/prometheus/cmd/promtool"
    # Named like its module, and still a cmd/ package: Prometheus' module root is no package at all.
    assert package_of("github.com/prometheus/prometheus", "prometheus") == "github.com/prometheus/prometheus/cmd/prometheus"


def test_maven_resolution_prints_a_line_before_and_elapsed_time_while_it_runs(tmp_path, monkeypatch, capsys):
    """A stand-in ``mvn`` that takes its time, as Maven does on a first run."""
    from eosink.worker.stack import gotools, jvm

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    mvn = fake_bin / "mvn"
    mvn.write_text('#!/bin/sh\nsleep 0.7\nfor a in "$@"; do case "$a" in -DoutputDirectory=*) '
                   'touch "${a#-DoutputDirectory=}/x.jar";; esac; done\n')
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "poms" / "kafka").mkdir(parents=True)
    (tmp_path / "poms" / "kafka" / "pom.xml").write_text("<project/>")
    monkeypatch.setattr(jvm, "POM_DIR", tmp_path / "poms")
    monkeypatch.setattr(gotools, "PROGRESS_EVERY_S", 0.2)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    target = jvm.resolve_jars("kafka", "kafka")
    assert (target / "x.jar").exists()
    err = capsys.readouterr().err
    assert "kafka: resolving kafka jars with Maven (first run only)..." in err, err
    assert len(re.findall(r"still resolving kafka jars with Maven, \d+ s so far", err)) >= 2, err
    jvm.resolve_jars("kafka", "kafka")
    assert capsys.readouterr().err == "", "a resolved pom is silent"
