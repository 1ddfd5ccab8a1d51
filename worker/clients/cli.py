"""``eosink``: the command line.

    eosink stack up|down|status         the local stack (Kafka, ZooKeeper, PostgreSQL, S3)
    eosink worker [options]             run a worker (flags or EOSINK_* environment variables)
    eosink connectors apply FILE...     register / update connectors through a worker's REST API
    eosink connectors list|status|pause|resume|stop|restart|delete|offsets|transactions ...
    eosink spark run JOB [--run-id ..]  run a Spark outbox job
    eosink demo                         the end-to-end demo
    eosink images build [worker|spark]  build the container images (podman when no Docker engine answers)

Every failure prints one clear line naming the culprit and exits non-zero; never a bare traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from eosink.connectors.api.errors import EosinkError


def _defaults() -> dict[str, str]:
    """Endpoints of the local stack, when there is one; environment variables win."""
    out = {"bootstrap": "", "zookeeper": ""}
    try:
        from eosink.worker.stack import load_endpoints

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


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise EosinkError(f"{name}={raw!r} is not an integer", component="cli") from None


#: Kafka client settings a worker passes through to every consumer, producer and admin client.
KAFKA_PREFIXES = ("security.", "sasl.", "ssl.")


def kafka_settings(flags: list[str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """``--kafka-property KEY=VALUE`` flags over ``EOSINK_KAFKA_<KEY>`` variables (``EOSINK_KAFKA_SASL_USERNAME``
    -> ``sasl.username``); only security settings come from the environment (``security.*``, ``sasl.*``, ``ssl.*``)."""
    out: dict[str, str] = {}
    for k, v in (environ if environ is not None else os.environ).items():
        if k.startswith("EOSINK_KAFKA_") and v != "":
            key = k[len("EOSINK_KAFKA_"):].lower().replace("_", ".")
            if key.startswith(KAFKA_PREFIXES):
                out[key] = v
    for flag in flags:
        key, sep, value = flag.partition("=")
        if not sep or not key.strip():
            raise EosinkError(f"--kafka-property {flag!r}: expected KEY=VALUE", component="cli")
        out[key.strip()] = value
    return out


def _require(value: str, what: str, flag: str, env: str) -> str:
    if not value:
        raise EosinkError(f"no {what}: pass {flag} or set {env} (or start the local stack: eosink stack up)", component="cli")
    return value


def cmd_worker(args: argparse.Namespace) -> int:
    from eosink.worker.logging import configure, get_logger, register_secret
    from eosink.worker.control.rest.auth import RestAuth
    from eosink.worker.control.runner import Worker, WorkerOptions

    configure(args.log_level)
    kafka = kafka_settings(args.kafka_property)
    auth = RestAuth.from_settings(args.rest_basic_auth, args.rest_token)
    for key, value in kafka.items():
        if any(w in key for w in ("password", "secret", "jaas")):
            register_secret(value)
    for secret in (args.rest_token, (args.rest_basic_auth or "").partition(":")[2]):
        register_secret(secret or "")
    opts = WorkerOptions(
        bootstrap=_require(args.bootstrap_servers, "Kafka bootstrap servers", "--bootstrap-servers", "EOSINK_BOOTSTRAP_SERVERS"),
        zookeeper=_require(args.zookeeper, "ZooKeeper hosts", "--zookeeper", "EOSINK_ZOOKEEPER"),
        cluster=args.cluster,
        worker_id=args.worker_id,
        session_timeout_s=args.session_timeout,
        rest_host=args.rest_host,
        rest_port=args.rest_port,
        rest_advertised_url=args.rest_advertised_url,
        rest_auth=auth,
        kafka=kafka,
    )
    get_logger("eosink.worker.clients.cli").info("worker_configuring", cluster=opts.cluster, bootstrap=opts.bootstrap, zookeeper=opts.zookeeper,
                                  rest=f"{opts.rest_host}:{opts.rest_port}" if opts.rest_port else "off",
                                  rest_auth=("basic" if auth and auth.basic else "") + ("+token" if auth and auth.token else ""),
                                  kafka_settings=sorted(kafka))
    from eosink.worker.control.preflight import check_kafka

    check_kafka(opts.bootstrap, kafka)  # a wrong address exits non-zero now, not once a connector is assigned
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    worker = Worker(opts)
    worker.run(stop)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from eosink.worker.version import VERSION

    p = argparse.ArgumentParser(prog="eosink", description="Exactly-once sink worker cluster.")
    p.add_argument("--version", action="version", version=f"eosink {VERSION}")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("stack", help="local stack: up | down | status", add_help=False)
    sub.add_parser("spark", help="Spark jobs: run <job>", add_help=False)
    sub.add_parser("demo", help="run the end-to-end demo", add_help=False)
    sub.add_parser("images", help="container images: build [worker] [spark]", add_help=False)

    w = sub.add_parser("worker", help="run a worker")
    _cluster_args(w)
    w.add_argument("--worker-id", default=os.environ.get("EOSINK_WORKER_ID", ""), help="stable id (EOSINK_WORKER_ID)")
    w.add_argument("--session-timeout", type=float, default=float(os.environ.get("EOSINK_SESSION_TIMEOUT", "10")),
                   help="ZooKeeper session timeout, seconds (EOSINK_SESSION_TIMEOUT)")
    w.add_argument("--metrics-port", type=int, default=int(os.environ.get("EOSINK_METRICS_PORT", "0")),
                   help="serve Prometheus /metrics on this port; 0 = off (EOSINK_METRICS_PORT)")
    w.add_argument("--metrics-host", default=os.environ.get("EOSINK_METRICS_HOST", "0.0.0.0"), help="(EOSINK_METRICS_HOST)")
    w.add_argument("--rest-host", default=os.environ.get("EOSINK_REST_HOST", "0.0.0.0"), help="REST API address (EOSINK_REST_HOST)")
    w.add_argument("--rest-port", type=int, default=_env_int("EOSINK_REST_PORT", 8083),
                   help="REST API port, also serving /metrics, /health, /ready; 0 = off (EOSINK_REST_PORT, default 8083)")
    w.add_argument("--rest-advertised-url", default=os.environ.get("EOSINK_REST_ADVERTISED_URL", ""),
                   help="URL other workers and tools reach this worker at (EOSINK_REST_ADVERTISED_URL)")
    w.add_argument("--rest-basic-auth", default=os.environ.get("EOSINK_REST_BASIC_AUTH") or None, metavar="USER:PASSWORD",
                   help="require HTTP basic auth on the REST API (EOSINK_REST_BASIC_AUTH)")
    w.add_argument("--rest-token", default=os.environ.get("EOSINK_REST_TOKEN") or None,
                   help="require this bearer token on the REST API (EOSINK_REST_TOKEN)")
    w.add_argument("--kafka-property", action="append", default=[], metavar="KEY=VALUE",
                   help="Kafka client setting for every consumer/producer/admin, e.g. security.protocol=SASL_SSL "
                        "(also EOSINK_KAFKA_SECURITY_PROTOCOL, EOSINK_KAFKA_SASL_USERNAME, EOSINK_KAFKA_SSL_CA_LOCATION, ...)")
    w.add_argument("--log-level", default=os.environ.get("EOSINK_LOG_LEVEL", "INFO"), help="(EOSINK_LOG_LEVEL)")
    w.set_defaults(func=cmd_worker)

    from eosink.worker.clients.connectors_cmd import add_parser

    add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "stack":
            from eosink.worker.stack.cli import main as stack_main

            return stack_main(argv[1:])
        if argv and argv[0] == "spark":
            from eosink.spark_jobs.cli import main as spark_main

            return spark_main(argv[1:])
        if argv and argv[0] == "demo":
            from eosink.worker.stack.demo import main as demo_main

            return demo_main(argv[1:])
        if argv and argv[0] == "images":
            from eosink.worker.stack.images import main as images_main

            return images_main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except EosinkError as exc:
        print(f"eosink: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
