"""``eosink``: the command line.

    eosink stack up|down|status         the local stack (Kafka, ZooKeeper, PostgreSQL, S3)
    eosink worker [options]             run a worker (flags or EOSINK_* environment variables)
    eosink connectors apply FILE...     register / update connectors from JSON files
    eosink connectors list|delete NAME
    eosink spark run JOB [--run-id ..]  run a Spark outbox job
    eosink demo                         the end-to-end demo

Every failure prints one clear line naming the culprit and exits non-zero; never a bare traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from connectors.errors import EosinkError


def _defaults() -> dict[str, str]:
    """Endpoints of the local stack, when there is one; environment variables win."""
    out = {"bootstrap": "", "zookeeper": ""}
    try:
        from worker.stack import load_endpoints

        ep = load_endpoints()
        out = {"bootstrap": ep.kafka_bootstrap, "zookeeper": ep.zookeeper_hosts}
    except Exception:  # noqa: BLE001 - no local stack: flags or env must say
        pass
    out["bootstrap"] = os.environ.get("EOSINK_BOOTSTRAP_SERVERS", out["bootstrap"])
    out["zookeeper"] = os.environ.get("EOSINK_ZOOKEEPER", out["zookeeper"])
    return out


def _cluster_args(p: argparse.ArgumentParser) -> None:
    d = _defaults()
    p.add_argument("--bootstrap-servers", default=d["bootstrap"], help="Kafka bootstrap servers (EOSINK_BOOTSTRAP_SERVERS)")
    p.add_argument("--zookeeper", default=d["zookeeper"], help="ZooKeeper hosts (EOSINK_ZOOKEEPER)")
    p.add_argument("--cluster", default=os.environ.get("EOSINK_CLUSTER", "default"), help="cluster name (EOSINK_CLUSTER)")


def _require(value: str, what: str, flag: str, env: str) -> str:
    if not value:
        raise EosinkError(f"no {what}: pass {flag} or set {env} (or start the local stack: eosink stack up)", component="cli")
    return value


def cmd_worker(args: argparse.Namespace) -> int:
    from worker.logging import configure
    from worker.runner import Worker, WorkerOptions

    configure()
    opts = WorkerOptions(
        bootstrap=_require(args.bootstrap_servers, "Kafka bootstrap servers", "--bootstrap-servers", "EOSINK_BOOTSTRAP_SERVERS"),
        zookeeper=_require(args.zookeeper, "ZooKeeper hosts", "--zookeeper", "EOSINK_ZOOKEEPER"),
        cluster=args.cluster,
        worker_id=args.worker_id,
        session_timeout_s=args.session_timeout,
    )
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    worker = Worker(opts)
    worker.run(stop)
    return 0


def cmd_connectors(args: argparse.Namespace) -> int:
    from worker.config import load_connector_file
    from worker.runner import ConnectorStore
    from worker.zk import ZkSession

    session = ZkSession(_require(args.zookeeper, "ZooKeeper hosts", "--zookeeper", "EOSINK_ZOOKEEPER"), args.cluster).start()
    try:
        store = ConnectorStore(session)
        if args.action == "apply":
            configs = [load_connector_file(f, resolve=False) for f in args.files]  # validate all before writing any
            for cfg in configs:
                created = store.put(cfg.name, cfg.raw)
                print(f"{'created' if created else 'updated'} connector {cfg.name}")
        elif args.action == "list":
            for name in store.names():
                print(name)
        elif args.action == "delete":
            if not store.delete(args.name):
                raise EosinkError(f"connector {args.name!r} not found", component="cli")
            print(f"deleted connector {args.name}")
    finally:
        session.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eosink", description="Exactly-once sink worker cluster.")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("stack", help="local stack: up | down | status", add_help=False)
    sub.add_parser("spark", help="Spark jobs: run <job>", add_help=False)
    sub.add_parser("demo", help="run the end-to-end demo", add_help=False)

    w = sub.add_parser("worker", help="run a worker")
    _cluster_args(w)
    w.add_argument("--worker-id", default=os.environ.get("EOSINK_WORKER_ID", ""), help="stable id (EOSINK_WORKER_ID)")
    w.add_argument("--session-timeout", type=float, default=float(os.environ.get("EOSINK_SESSION_TIMEOUT", "10")),
                   help="ZooKeeper session timeout, seconds (EOSINK_SESSION_TIMEOUT)")
    w.add_argument("--metrics-port", type=int, default=int(os.environ.get("EOSINK_METRICS_PORT", "0")),
                   help="serve Prometheus /metrics on this port; 0 = off (EOSINK_METRICS_PORT)")
    w.add_argument("--metrics-host", default=os.environ.get("EOSINK_METRICS_HOST", "0.0.0.0"), help="(EOSINK_METRICS_HOST)")
    w.set_defaults(func=cmd_worker)

    c = sub.add_parser("connectors", help="register and manage connectors")
    _cluster_args(c)
    csub = c.add_subparsers(dest="action", required=True)
    a = csub.add_parser("apply", help="create or update connectors from JSON files")
    a.add_argument("files", nargs="+")
    csub.add_parser("list")
    d = csub.add_parser("delete")
    d.add_argument("name")
    c.set_defaults(func=cmd_connectors)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "stack":
            from worker.stack.cli import main as stack_main

            return stack_main(argv[1:])
        if argv and argv[0] == "spark":
            from spark_jobs.cli import main as spark_main

            return spark_main(argv[1:])
        if argv and argv[0] == "demo":
            from worker.demo import main as demo_main

            return demo_main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except EosinkError as exc:
        print(f"eosink: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
