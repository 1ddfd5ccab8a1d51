"""``make observe``: a three-worker cluster on the local stack, watched by a real Prometheus with the
shipped alert rules, then a drill an operator can watch: a task fails and a worker is killed.

It prints the Prometheus URL and the firing alerts (EosinkTaskFailed, EosinkWorkerDown), then keeps
everything running and prints each change of the firing alerts until Ctrl-C. The rules are
docker/observability/alerts.yml with every ``for:`` shortened (``--for``, default 5s) so the drill
takes seconds, not minutes; ``--for keep`` leaves them as shipped.

    python bench/observe.py [--for 5s] [--port 9090] [--no-drill] [--once] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eosink.worker.stack import load_endpoints  # noqa: E402
from eosink.worker.stack.layout import StackLayout  # noqa: E402
from eosink.worker.stack.prometheus import LocalPrometheus  # noqa: E402
from tests.procs import WorkerProcess, free_port, publish, register, wait_until  # noqa: E402
from tests.restkit import call, produce, start_worker  # noqa: E402

PARTITIONS = 6


def show(alerts: list[dict]) -> str:
    if not alerts:
        return "  (none)"
    lines = []
    for a in sorted(alerts, key=lambda a: (a["labels"]["alertname"], sorted(a["labels"].items()))):
        labels = {k: v for k, v in a["labels"].items() if k not in ("alertname", "job")}
        lines.append(f"  {a['labels']['alertname']} {labels}: {a['annotations'].get('summary', '')}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--for", dest="alert_for", default="5s", help="every rule's for: (default 5s; 'keep': as shipped)")
    ap.add_argument("--port", type=int, default=9090, help="Prometheus port on 127.0.0.1 (a free one if taken)")
    ap.add_argument("--no-drill", action="store_true", help="only run the healthy cluster")
    ap.add_argument("--once", action="store_true", help="exit after the drill instead of watching")
    ap.add_argument("--workdir", type=Path, help="logs, Prometheus data (default: <EOSINK_HOME>/observe/<run>)")
    args = ap.parse_args()

    stack = load_endpoints()
    from confluent_kafka.admin import AdminClient, NewTopic

    run = f"observe_{uuid.uuid4().hex[:8]}"
    workdir = (args.workdir or StackLayout.for_home(None).home / "observe") / run
    workdir.mkdir(parents=True, exist_ok=True)
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    topics = [run, f"{run}_bad"]
    for t, n in zip(topics, (PARTITIONS, 1)):
        admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1)])[t].result(30)
    name = run.replace("_", "-")
    config = {"connector.class": "postgres", "topics": run, "connection.url": "${env:EOSINK_PG_DSN}",
              "table.name.format": run, "commit.interval.ms": "500", "tasks.max": "3"}
    register(stack.zookeeper_hosts, run, name, config)
    workers: list[WorkerProcess] = []
    prom: LocalPrometheus | None = None
    try:
        print(f"starting 3 workers (cluster {run}, logs in {workdir})", flush=True)
        workers = [start_worker(stack, run, f"w{i}", workdir, session_timeout=6.0) for i in (1, 2, 3)]
        targets = [w.url.removeprefix("http://") for w in workers]
        port = args.port
        try:
            prom = LocalPrometheus(workdir / "prometheus", targets, port, interval="2s",
                                   alert_for=None if args.alert_for == "keep" else args.alert_for).start(timeout=15)
        except Exception:  # noqa: BLE001 - the port is taken (another Prometheus?): use a free one
            port = free_port()
            prom = LocalPrometheus(workdir / "prometheus", targets, port, interval="2s",
                                   alert_for=None if args.alert_for == "keep" else args.alert_for).start()
        print(f"Prometheus: {prom.url}/alerts  (graph: {prom.url}/graph; workers: {', '.join(targets)})", flush=True)
        print("Grafana: import docker/observability/grafana-dashboard.json with this Prometheus as its data source",
              flush=True)
        publish(stack.kafka_bootstrap, run, PARTITIONS, txns=4, per_txn=250, aborted_every=3)
        wait_until(lambda: all(prom.targets_up().values()) and len(prom.targets_up()) == 3, 30, "the 3 workers scraped")
        time.sleep(8)
        print("healthy cluster, firing alerts:\n" + show(prom.alerts()), flush=True)
        if not args.no_drill:
            bad = f"{name}-bad"
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as pg:
                pg.execute(f'CREATE TABLE IF NOT EXISTS "{run}_bad" (id text, payload bigint)')
            produce(stack.kafka_bootstrap, f"{run}_bad", [(0, json.dumps({"id": "x", "payload": "not a number"}).encode())])
            call(workers[0].url, "POST", "/connectors", {"name": bad, "config": {**config, "topics": f"{run}_bad",
                                                                                 "table.name.format": f"{run}_bad"}})
            print(f"drill: connector {bad} meets a string for a bigint column; worker w2 ({targets[1]}) gets kill -9",
                  flush=True)
            workers[1].signal(signal.SIGKILL)

            def both() -> bool:
                names = {a["labels"]["alertname"] for a in prom.alerts()}
                return {"EosinkTaskFailed", "EosinkWorkerDown"} <= names

            wait_until(both, 120, "EosinkTaskFailed and EosinkWorkerDown to fire", interval=1)
            print("firing alerts:\n" + show(prom.alerts()), flush=True)
        if args.once:
            return 0
        print(f"watching (Ctrl-C stops the workers and Prometheus; {prom.url}/alerts)", flush=True)
        last = show(prom.alerts())
        while True:
            time.sleep(5)
            now = show(prom.alerts())
            if now != last:
                print(time.strftime("%H:%M:%S") + " firing alerts:\n" + now, flush=True)
                last = now
    except KeyboardInterrupt:
        return 0
    finally:
        if prom is not None:
            prom.stop()
        for w in workers:
            w.stop()
        for f in admin.delete_topics(topics).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - cleanup only
                pass


if __name__ == "__main__":
    sys.exit(main())
