"""The Helm chart (deploy/helm/eosink), checked with the real helm and run with podman.

* helm is built from its Go module (cached), ``helm lint --strict`` and ``helm template`` run with the
  required values only and with every optional part on;
* every rendered manifest is checked against the API schemas of Kubernetes v1.34 (the OpenAPI v3
  documents of the ``k8s.io/kubernetes`` Go module, strict: unknown fields fail); the Prometheus
  Operator kinds, which those documents do not define, are checked field by field here;
* bad values fail at ``helm template`` time with a message naming the value;
* the rendered worker pods, ConfigMaps and Secret run under ``podman kube play`` against the local
  stack: the chart's connectors Job applies a connector, three workers deliver it while one is
  SIGKILLed and one stopped, and PostgreSQL holds every record once (tests/kubekit.py says what
  podman cannot run as rendered, and what is played instead).
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from eosink.worker.stack import helm, k8s_schema
from tests import kubekit
from tests.procs import REPO

SECRET_FILE = "/etc/eosink/secrets/credentials.properties"
REQUIRED = {"zookeeper": "zk-0.zk:2181,zk-1.zk:2181", "kafka": {"bootstrapServers": "kafka:9092"}}
EVERYTHING: dict[str, Any] = {
    **REQUIRED,
    "kafka": {"bootstrapServers": "kafka:9092",
              "properties": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "eosink",
                             "sasl.password": f"${{file:{SECRET_FILE}:kafka.password}}"}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "prometheusRule": {"enabled": True},
    "secrets": {"files": {"credentials.properties": {"orders.dsn": "postgresql://eosink:pw@postgres:5432/eosink",
                                                     "kafka.password": "s3cret"}}},
    "env": {"EOSINK_STARTUP_TIMEOUT": "60"},
    "extraEnv": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    "home": {"existingClaim": "eosink-shared"},
    "connectors": {
        "orders": json.dumps({"name": "orders", "config": {"connector.class": "postgres", "topics": "orders",
                                                           "connection.url": f"${{file:{SECRET_FILE}:orders.dsn}}"}}),
        "files": {"name": "files", "config": {"connector.class": "filesystem", "topics": "files", "file.path": "/var/lib/eosink/out"}},
    },
    "connectorsJob": {"delete": ["retired"], "extraEnv": [{"name": "EOSINK_REST_TOKEN", "value": f"${{file:{SECRET_FILE}:rest.token}}"}]},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "eosink", "effect": "NoSchedule"}],
    "podAnnotations": {"example.com/team": "data"},
    "imagePullSecrets": [{"name": "registry"}],
}

#: The demo servers on, no addresses given: the workers use the demo's.
DEMO: dict[str, Any] = {"demo": {"enabled": True}}


def _one(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = kubekit.by_kind(manifests, kind)
    assert len(found) == 1, (kind, [m["kind"] for m in manifests])
    return found[0]


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    return helm.binary(progress=sys.stderr)


@pytest.fixture(scope="module")
def schemas() -> Path:
    return k8s_schema.spec_dir()


def test_helm_without_go_names_go_its_module_and_a_cache_folder_called_helm_not_v3(tmp_path, monkeypatch):
    from eosink.worker.stack.errors import ComponentError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ComponentError) as e:
        helm.binary()
    text = str(e.value)
    assert text.startswith("helm:") and "`go`" in text and "helm.sh/helm/v3" in text, text
    assert str(tmp_path / "eosink" / "helm" / helm.VERSION) in text, text


@pytest.mark.parametrize("values", [REQUIRED, EVERYTHING, DEMO], ids=["required-only", "every-option", "demo-servers"])
def test_chart_passes_helm_lint_strict(helm_bin, values):
    report = helm.lint(values)
    assert "0 chart(s) failed" in report, report


@pytest.mark.parametrize("values", [REQUIRED, EVERYTHING, DEMO], ids=["required-only", "every-option", "demo-servers"])
def test_every_rendered_manifest_is_accepted_by_the_kubernetes_v1_34_schemas(helm_bin, schemas, values):
    manifests = helm.template(values)
    errors = [e for m in manifests for e in k8s_schema.validate(m, schemas)]
    checked_elsewhere = {"unchecked: ServiceMonitor eosink", "unchecked: PrometheusRule eosink"}
    assert [e for e in errors if not any(e.startswith(c) for c in checked_elsewhere)] == []
    kinds = sorted(m["kind"] for m in manifests)
    expected = ["PodDisruptionBudget", "Service", "Service", "ServiceAccount", "StatefulSet"]
    if values is EVERYTHING:
        expected += ["ConfigMap", "Job", "PrometheusRule", "Secret", "ServiceMonitor"]
    if values is DEMO:
        expected += ["Deployment", "Service"] * 4
    assert kinds == sorted(expected)


def test_schema_check_rejects_an_unknown_field_a_wrong_type_and_a_bad_name(helm_bin, schemas):
    sts = _one(helm.template(REQUIRED), "StatefulSet")
    sts["spec"]["replicas"] = "3"
    sts["spec"]["template"]["spec"]["containers"][0]["imagee"] = "typo"
    sts["metadata"]["name"] = "Not_A_DNS_Label"
    errors = "\n".join(k8s_schema.validate(sts, schemas))
    assert "spec.replicas: '3' is not of type 'integer'" in errors
    assert "'imagee' was unexpected" in errors
    assert "is not a DNS label" in errors


def test_workers_get_stable_ids_probes_a_graceful_grace_period_and_run_as_the_image_user(helm_bin):
    manifests = helm.template(EVERYTHING, release="prod")
    sts = _one(manifests, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    env = {e["name"]: e for e in worker["env"]}
    assert env["EOSINK_WORKER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, "pod name = worker id"
    assert env["EOSINK_ZOOKEEPER"]["value"] == REQUIRED["zookeeper"]
    assert env["EOSINK_BOOTSTRAP_SERVERS"]["value"] == "kafka:9092"
    assert env["EOSINK_CLUSTER"]["value"] == "prod"
    assert env["EOSINK_KAFKA_SASL_PASSWORD"]["value"].startswith("${file:"), "the secret itself is never in the pod spec"
    assert env["EOSINK_REST_ADVERTISED_URL"]["value"] == "http://$(EOSINK_WORKER_ID).prod-eosink-workers.eosink.svc:8083"
    assert [e["name"] for e in worker["env"]].index("EOSINK_WORKER_ID") < [e["name"] for e in worker["env"]].index(
        "EOSINK_REST_ADVERTISED_URL"), "$(VAR) expands only variables defined before it"
    assert worker["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"] is True
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    assert worker["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    assert mounts["secrets"]["mountPath"] == "/etc/eosink/secrets" and mounts["secrets"]["readOnly"] is True
    headless = [s for s in kubekit.by_kind(manifests, "Service") if s["spec"].get("clusterIP") == "None"]
    assert [s["metadata"]["name"] for s in headless] == [sts["spec"]["serviceName"]]
    pdb = _one(manifests, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    secret = _one(manifests, "Secret")
    assert "orders.dsn=postgresql://eosink:pw@postgres:5432/eosink" in secret["stringData"]["credentials.properties"].splitlines()


def test_connectors_become_a_configmap_applied_by_a_post_install_and_post_upgrade_job(helm_bin):
    manifests = helm.template(EVERYTHING)
    data = _one(manifests, "ConfigMap")["data"]
    assert json.loads(data["orders.json"]) == json.loads(EVERYTHING["connectors"]["orders"])
    assert json.loads(data["files.json"]) == EVERYTHING["connectors"]["files"], "a connector given as YAML is the same JSON"
    job = _one(manifests, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    script = container["args"][0]
    assert 'eosink connectors --url "$EOSINK_URL" apply /connectors' in script
    assert 'eosink connectors --url "$EOSINK_URL" delete "retired"' in script, "a connector goes only when named in connectorsJob.delete"
    assert {"name": "EOSINK_URL", "value": "http://eosink:8083"} in container["env"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/connectors", "/etc/eosink/secrets"}, \
        "the Job reads its REST credentials through ${file:...} like the workers"
    assert _one(helm.template(REQUIRED, hooks=True), "StatefulSet") and not kubekit.by_kind(helm.template(REQUIRED), "Job")


def test_prometheus_rule_is_the_shipped_alerts_file_and_the_service_monitor_scrapes_job_eosink(helm_bin):
    shipped = REPO / "docker" / "observability" / "alerts.yml"
    assert (helm.CHART / "files" / "alerts.yml").read_bytes() == shipped.read_bytes(), \
        "deploy/helm/eosink/files/alerts.yml must be a copy of docker/observability/alerts.yml"
    manifests = helm.template(EVERYTHING)
    rule = _one(manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(shipped.read_text())
    monitor = _one(manifests, "ServiceMonitor")
    service = next(s for s in kubekit.by_kind(manifests, "Service") if s["spec"].get("clusterIP") != "None")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "eosink"} in endpoint["relabelings"], "the alert rules select job=\"eosink\""
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_demo_servers_are_compose_s_images_and_settings_and_the_workers_use_them(helm_bin):
    from eosink.worker.stack import container_demo as cd

    compose = cd.compose()["services"]
    manifests = helm.template(DEMO, release="try")
    deployments = {d["metadata"]["name"].removeprefix("try-eosink-demo-"): d["spec"]["template"]["spec"]["containers"][0]
                   for d in kubekit.by_kind(manifests, "Deployment")}
    assert sorted(deployments) == ["kafka", "minio", "postgres", "zookeeper"]
    for name, container in deployments.items():
        assert container["image"] == compose[name]["image"], name
    assert "max_prepared_transactions=64" in deployments["postgres"]["args"], "two-phase commit needs prepared transactions"
    env = {e["name"]: e.get("value") for e in _one(manifests, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EOSINK_ZOOKEEPER"] == "try-eosink-demo-zookeeper:2181" and env["EOSINK_BOOTSTRAP_SERVERS"] == "try-eosink-demo-kafka:9092"
    demo_config = (REPO / "configs" / "demo-orders.json").read_text()
    needed = set(re.findall(r"\$\{env:([A-Z0-9_]+)\}", demo_config))
    assert needed and needed <= env.keys(), f"configs/demo-orders.json reads {sorted(needed - env.keys())}, unset"
    assert not kubekit.by_kind(helm.template(REQUIRED), "Deployment"), "the demo servers are off by default"


@pytest.mark.parametrize(("values", "message"), [
    ({"kafka": {"bootstrapServers": "kafka:9092"}}, "zookeeper is required"),
    ({"zookeeper": "zk:2181"}, "kafka.bootstrapServers is required"),
    ({**REQUIRED, "replicas": 0}, "/replicas': minimum: got 0, want 1"),
    ({**REQUIRED, "connectors": {"orders": '{"name": "orders", "config": {"topics": "o",}}'}}, "connectors.orders is not valid JSON"),
    ({**REQUIRED, "connectors": {"orders": '{"name": "orders"}'}}, 'connectors.orders: needs a "config" object'),
    ({**REQUIRED, "connectors": {"orders": '{"name": "other", "config": {}}'}}, 'its "name" is "other"'),
], ids=["no-zookeeper", "no-kafka", "zero-replicas", "connector-not-json", "connector-without-config", "connector-misnamed"])
def test_bad_values_fail_helm_template_naming_the_value(helm_bin, values, message):
    with pytest.raises(helm.HelmError) as e:
        helm.template(values)
    assert message in str(e.value), str(e.value)


# --- run under podman ---------------------------------------------------------------------------


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except OSError:
        return 0


def _probe_urls(statefulset: dict[str, Any], port: int) -> dict[str, str]:
    worker = statefulset["spec"]["template"]["spec"]["containers"][0]
    return {p: f"http://127.0.0.1:{port}{worker[p]['httpGet']['path']}" for p in ("livenessProbe", "readinessProbe")}


@pytest.mark.containers
def test_chart_pods_under_podman_deliver_a_chart_applied_connector_exactly_once_through_kill_and_stop(
        helm_bin, stack, unique, make_topic, tmp_path):
    import psycopg

    from eosink.connectors.postgres.book import prepared_manifests
    from eosink.worker.stack import container_demo as cd
    from eosink.worker.stack import images
    from eosink.worker.version import VERSION

    built = images.build(["worker"], report=lambda m: print(m, file=sys.stderr))["worker"]
    topic = make_topic(4)
    connector = unique.replace("_", "-")
    release = f"h{unique[-8:]}"
    values = {
        "image": {"repository": "localhost/eosink-worker", "tag": VERSION, "pullPolicy": "Never"},
        "zookeeper": stack.zookeeper_hosts, "kafka": {"bootstrapServers": stack.kafka_bootstrap},
        "cluster": unique, "sessionTimeout": "6s",
        "secrets": {"files": {"credentials.properties": {"orders.dsn": stack.postgres_dsn}}},
        "connectors": {connector: json.dumps({"name": connector, "config": {
            "connector.class": "postgres", "topics": topic, "connection.url": f"${{file:{SECRET_FILE}:orders.dsn}}",
            "table.name.format": unique, "auto.create": "true", "insert.mode": "insert", "tasks.max": "3",
            "commit.interval.ms": "500"}})},
    }
    assert built["tag"] == f"eosink-worker:{VERSION}"
    manifests = helm.template(values, release=release)
    sts = _one(manifests, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    ports = [cd.free_port() for _ in range(3)]
    play = kubekit.kube_play(tmp_path)
    names = [f"{sts['metadata']['name']}-{i}" for i in range(3)]
    workers = {n: f"{n}-worker" for n in names}  # podman names a pod's container <pod>-<container>
    t0 = time.monotonic()
    try:
        config = kubekit.config_objects(manifests)  # podman reads ConfigMaps only from the file that uses them
        play.play([*config, *kubekit.worker_pods(sts, ports)], "workers")
        for name, port in zip(names, ports):
            probes = _probe_urls(sts, port)
            cd._wait(lambda p=probes: _get(p["readinessProbe"]) == 200, 90, f"{name}'s readiness probe")
            assert _get(probes["livenessProbe"]) == 200
        uids = {n: play.podman("exec", c, "id", "-u").strip() for n, c in workers.items()}
        assert set(uids.values()) == {"10001"}, uids

        def run_job(rendered: list[dict[str, Any]], run: int) -> str:
            """The chart's connectors Job as helm would run it after an install (run 0) or an upgrade: its output."""
            pod = kubekit.job_pod(_one(rendered, "Job"), f"http://127.0.0.1:{ports[0]}", run)
            play.play([*kubekit.config_objects(rendered), pod], f"job-{run}")
            job = f"{pod['metadata']['name']}-{pod['spec']['containers'][0]['name']}"
            cd._wait(lambda: play.state(job)[0] == "exited", 90, "the connectors Job to finish")
            assert play.state(job)[1] == 0, play.logs(job)
            return play.logs(job)

        assert f"created connector {connector}" in run_job(manifests, 0)

        publisher = cd.Publisher(bootstrap=stack.kafka_bootstrap, topic=topic, partitions=4, txns=30, per_txn=300,
                                 pause_s=0.3, aborted_at=6)
        publisher.start()
        cd._wait(lambda: cd._pg_distinct(stack.postgres_dsn, unique) >= 600, 120, "delivery to start")
        owners = cd._owners(f"http://127.0.0.1:{ports[0]}", connector)
        assert owners == set(names), f"tasks.max=3 over three workers named after their pods: {owners}"

        assert publisher.is_alive(), "the kill must land mid-delivery"
        play.podman("kill", "--signal", "KILL", workers[names[2]])
        cd._wait(lambda: play.state(workers[names[2]])[0] != "running", 30, "the killed worker to die")
        assert play.state(workers[names[2]])[1] == 137
        play.restart(names[2])
        cd._wait(lambda: _get(_probe_urls(sts, ports[2])["readinessProbe"]) == 200, 90, "the killed worker back")

        assert publisher.is_alive(), "the stop must land mid-delivery"
        stopped_at = time.monotonic()
        play.podman("pod", "stop", "-t", str(sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]), names[1])
        stop_seconds = time.monotonic() - stopped_at
        assert play.state(workers[names[1]]) == ("exited", 0), play.logs(workers[names[1]])[-3000:]
        assert '"worker_stopped"' in play.logs(workers[names[1]])
        cd._wait(lambda: names[1] not in cd._owners(f"http://127.0.0.1:{ports[0]}", connector), 30,
                 "the stopped worker's partitions to move")

        publisher.join(300)
        assert publisher.error is None and publisher.result is not None, repr(publisher.error)
        committed, aborted = publisher.result
        assert len(committed) == 29 * 300 and len(aborted) == 300
        cd._wait(lambda: cd._pg_distinct(stack.postgres_dsn, unique) >= len(committed), 180, "every order delivered")
        time.sleep(2)  # a few more commit intervals: a duplicate would show now
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute(f'SELECT order_id FROM "{unique}"')]
            prepared = [gid for gid, name, _m in prepared_manifests(conn) if name == connector]  # pg_prepared_xacts
        assert len(ids) == len(set(ids)) == len(committed), (len(ids), len(set(ids)), len(committed))
        assert set(ids) == committed and not any(i.startswith("aborted-") for i in ids)
        assert prepared == [], "no prepared transaction may be left behind"
        url = f"http://127.0.0.1:{ports[0]}"
        assert f"updated connector {connector}" in run_job(manifests, 1), "an upgrade applies the same connector again, harmlessly"
        dropped = helm.template({**values, "connectors": {}, "connectorsJob": {"delete": ["no-such-connector"]}}, release=release)
        assert "already absent" in run_job(dropped, 2)
        assert cd._owners(url, connector) == {names[0], names[2]}, "a connector dropped from the values keeps running"
        retired = helm.template({**values, "connectors": {}, "connectorsJob": {"delete": [connector]}}, release=release)
        assert f"deleted connector {connector}" in run_job(retired, 3)
        with pytest.raises(urllib.error.HTTPError):
            cd._owners(url, connector)
        print(f"kube play: {len(committed)} orders once each; stop took {stop_seconds:.1f} s; "
              f"whole run {time.monotonic() - t0:.0f} s", file=sys.stderr)
    except Exception:
        for c in workers.values():
            print(f"--- {c} ---\n{play.logs(c)[-3000:]}", file=sys.stderr)
        raise
    finally:
        play.down()
