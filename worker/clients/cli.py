"""``eosink``: the command line.

    eosink stack up|down|status         the local stack (Kafka, ZooKeeper, PostgreSQL, S3)
    eosink cluster init [options]       create a cluster's ZooKeeper root with its ACLs (once, before its workers)
    eosink worker [options]             run a worker (flags or EOSINK_* environment variables)
    eosink connectors apply FILE...     register / update connectors through a worker's REST API
    eosink connectors list|status|pause|resume|stop|restart|delete|offsets|transactions ...
    eosink spark run JOB [--run-id ..]  run a Spark outbox job
    eosink demo                         the end-to-end demo
    eosink demo --stream                the streaming example end to end (a driver killed mid-way)
    eosink images build [worker|spark]  build the container images (podman when no Docker engine answers)

Every failure prints one clear line naming the culprit and exits non-zero; never a bare traceback.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
from collections.abc import Sequence

from eosink.connectors.api.errors import EosinkError
from eosink.worker.clients import typed
from eosink.worker.clients.typed import OneLineParser, setting


def _stack_defaults() -> dict[str, str]:
    """Endpoints of the local stack, when there is one (flags and environment variables win)."""
    try:
        from eosink.worker.stack import load_endpoints

        ep = load_endpoints()
        return {"bootstrap": ep.kafka_bootstrap, "zookeeper": ep.zookeeper_hosts}
    except Exception:  # noqa: BLE001 - no local stack: flags or env must say
        return {"bootstrap": "", "zookeeper": ""}


def _cluster_args(p: argparse.ArgumentParser) -> None:
    d = _stack_defaults()
    setting(p, "--bootstrap-servers", kind=typed.HOST_PORTS, env="EOSINK_BOOTSTRAP_SERVERS", default=d["bootstrap"],
            help="Kafka bootstrap servers")
    _zookeeper_args(p)


def _zookeeper_args(p: argparse.ArgumentParser) -> None:
    """The cluster's ZooKeeper: address, name, credentials (``eosink worker`` and ``eosink cluster init``)."""
    d = _stack_defaults()
    setting(p, "--zookeeper", kind=typed.ZK_HOSTS, env="EOSINK_ZOOKEEPER", default=d["zookeeper"], help="ZooKeeper hosts")
    setting(p, "--cluster", kind=typed.WORD, env="EOSINK_CLUSTER", default="default", help="cluster name")
    from eosink.worker.clients import zk_auth

    zk_auth.add_args(p, zk_auth.stack_defaults())
    setting(p, "--zookeeper-lock-open-tree", kind=typed.choice("true", "false"), env="EOSINK_ZOOKEEPER_LOCK_OPEN_TREE",
            default="false", metavar="true|false",
            help="once, with --zookeeper-user: take over a cluster tree left open to anyone by a run without "
                 "credentials (after checking its connectors), instead of refusing to start")


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


def stack_kafka_defaults(bootstrap: str, given: dict[str, str]) -> dict[str, str]:
    """The local secure stack's client settings for a worker pointed at that stack's own Kafka, as ``eosink-worker``.

    As for ZooKeeper (:func:`eosink.worker.clients.zk_auth.stack_defaults`): a worker against ``eosink stack up
    --secure`` needs no settings, and the password is a ``${file:...}`` reference into the stack's
    ``credentials.properties``, never a value. Only for the stack's own address, and only when the settings
    name no security of their own (``security.protocol`` or any ``sasl.*``), which then win whole.
    """
    if "security.protocol" in given or any(k.startswith("sasl.") for k in given):
        return {}
    try:
        from eosink.worker.stack import load_endpoints

        ep = load_endpoints()
    except Exception:  # noqa: BLE001 - no local stack: the settings must say
        return {}
    client = (ep.raw or {}).get("kafka", {}).get("client")
    if not ep.security or not client or bootstrap != ep.kafka_bootstrap:
        return {}
    from pathlib import Path

    from eosink.worker.stack.secure import Material

    material = Material(Path(ep.security["credentials_file"]).parent)
    return {**client, "sasl.username": material.user("kafka.worker"), "sasl.password": material.reference("kafka.worker")}


def _require(value: str, what: str, flag: str, env: str) -> str:
    if not value:
        raise EosinkError(f"no {what}: pass {flag} or set {env} (or start the local stack: eosink stack up)", component="cli")
    return value


def resolve_kafka_settings(kafka: dict[str, str]) -> dict[str, str]:
    """``kafka`` with ``${env:VAR}`` / ``${file:/path:key}`` resolved (``sasl.password=${file:/run/secrets/kafka:password}``),
    so a worker's Kafka credentials need never be on its command line; credential values are registered with the
    log redactor, as given and as resolved."""
    from eosink.worker.control.config import resolve_providers
    from eosink.worker.logging import register_secret, secret_looking

    out = {k: str(resolve_providers(v, key=f"--kafka-property {k}")) for k, v in kafka.items()}
    for key in out:
        if secret_looking(key):
            register_secret(kafka[key])
            register_secret(out[key])
    return out


def _rest_tls(args: argparse.Namespace) -> object | None:
    """The REST API's TLS context, built now: a bad certificate or key stops the worker before it joins the cluster."""
    from eosink.connectors.api.errors import ConfigError
    from eosink.worker.control.rest.tls import server_context

    if not (args.rest_tls_cert or args.rest_tls_key):
        return None
    ctx = server_context(args.rest_tls_cert, args.rest_tls_key)
    if args.rest_advertised_url.startswith("http://"):
        raise ConfigError("must be an https:// URL when the REST API serves TLS (--rest-tls-cert)",
                          key="--rest-advertised-url / EOSINK_REST_ADVERTISED_URL")
    return ctx


def _stop_on_signals(stop: threading.Event, signals: tuple[int, ...]) -> None:
    """Set ``stop`` when one of ``signals`` arrives, from a thread of its own.

    A Python signal handler runs on the main thread between two bytecodes, also inside another
    handler. ``Event.set`` takes the event's lock, so when a second SIGTERM (a shell's ``kill`` and its
    EXIT trap, an orchestrator repeating itself) landed while the first handler held it, the second
    handler waited for that lock forever and the worker hung, holding its REST port. The handler now
    only puts the signal on a ``SimpleQueue``, whose ``put`` is reentrant; a thread sets the event.
    """
    arrived: queue.SimpleQueue[int] = queue.SimpleQueue()

    def relay() -> None:
        arrived.get()
        stop.set()

    threading.Thread(target=relay, name="signals", daemon=True).start()
    for sig in signals:
        signal.signal(sig, lambda signum, _frame: arrived.put(signum))


def cmd_worker(args: argparse.Namespace) -> int:
    from eosink.worker.clients import zk_auth
    from eosink.worker.control.rest.auth import RestAuth
    from eosink.worker.control.runner import Worker, WorkerOptions
    from eosink.worker.logging import configure, get_logger, install_process_hooks, register_environment_secrets, register_secret

    configure(args.log_level)
    from eosink.worker.engine import registry_converters

    threading.Thread(target=registry_converters.warm, name="warm-registry-client", daemon=True).start()
    from eosink.connectors.postgres import pool

    pool.configure(args.postgres_pool_size)  # before any connector is assigned: every pool of this process takes it
    install_process_hooks()
    register_environment_secrets()
    given = kafka_settings(args.kafka_property)
    kafka = resolve_kafka_settings({**stack_kafka_defaults(args.bootstrap_servers, given), **given})
    auth = RestAuth.from_settings(args.rest_basic_auth, args.rest_token, args.rest_basic_auth_file, args.rest_token_file)
    for secret in auth.secrets() if auth else []:
        register_secret(secret)
    tls = _rest_tls(args)
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
        rest_tls=tls,
        zookeeper_credentials=zk_auth.credentials(args),
        zookeeper_ca_file=zk_auth.ca_file(args),
        zookeeper_lock_open_tree=args.zookeeper_lock_open_tree == "true",
        audit_interval_s=float(args.audit_interval),
        audit_max_records=args.audit_max_records,
    )
    get_logger("eosink.worker.clients.cli").info("worker_configuring", cluster=opts.cluster, bootstrap=opts.bootstrap,
                                  zookeeper=opts.zookeeper, rest=f"{opts.rest_host}:{opts.rest_port}" if opts.rest_port else "off",
                                  rest_auth=("basic" if auth and auth.basic else "") + ("+token" if auth and auth.token else ""),
                                  rest_tls=tls is not None,
                                  kafka_settings=sorted(kafka))
    from eosink.worker.control.preflight import check_kafka

    check_kafka(opts.bootstrap, kafka)  # a wrong address exits non-zero now, not once a connector is assigned
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host)
    stop = threading.Event()
    _stop_on_signals(stop, (signal.SIGTERM, signal.SIGINT))
    worker = Worker(opts)
    worker.run(stop)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from eosink.worker.version import VERSION

    p = OneLineParser(prog="eosink", description="Exactly-once sink worker cluster.")
    p.add_argument("--version", action="version", version=f"eosink {VERSION}")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("stack", help="local stack: up | down | status", add_help=False)
    sub.add_parser("spark", help="Spark jobs: run <job>", add_help=False)
    sub.add_parser("demo", help="run the end-to-end demo", add_help=False)
    sub.add_parser("images", help="container images: build [worker] [spark]", add_help=False)

    w = sub.add_parser("worker", help="run a worker")
    _cluster_args(w)
    setting(w, "--worker-id", kind=typed.TEXT, env="EOSINK_WORKER_ID", default="", help="stable id")
    setting(w, "--session-timeout", kind=typed.DURATION, env="EOSINK_SESSION_TIMEOUT", default="10",
            help="ZooKeeper session timeout: seconds, or 500ms / 10s / 2m")
    setting(w, "--metrics-port", kind=typed.PORT, env="EOSINK_METRICS_PORT", default="0",
            help="serve Prometheus /metrics on this port; 0 = off")
    setting(w, "--metrics-host", kind=typed.HOST, env="EOSINK_METRICS_HOST", default="0.0.0.0", help="metrics address")
    setting(w, "--rest-host", kind=typed.HOST, env="EOSINK_REST_HOST", default="0.0.0.0", help="REST API address")
    setting(w, "--rest-port", kind=typed.PORT, env="EOSINK_REST_PORT", default="8083",
            help="REST API port, also serving /metrics, /health, /ready; 0 = off (default 8083)")
    setting(w, "--rest-advertised-url", kind=typed.URL, env="EOSINK_REST_ADVERTISED_URL", default="",
            help="URL other workers and tools reach this worker at")
    setting(w, "--rest-basic-auth", kind=typed.USER_PASSWORD, env="EOSINK_REST_BASIC_AUTH", metavar="USER:PASSWORD",
            help="require HTTP basic auth on the REST API")
    setting(w, "--rest-token", kind=typed.TEXT, env="EOSINK_REST_TOKEN", help="require this bearer token on the REST API")
    setting(w, "--rest-basic-auth-file", kind=typed.TEXT, env="EOSINK_REST_BASIC_AUTH_FILE", metavar="PATH",
            help="like --rest-basic-auth, read from the first line of this file (kept off the command line)")
    setting(w, "--rest-token-file", kind=typed.TEXT, env="EOSINK_REST_TOKEN_FILE", metavar="PATH",
            help="like --rest-token, read from the first line of this file")
    setting(w, "--rest-tls-cert", kind=typed.TEXT, env="EOSINK_REST_TLS_CERT", default="", metavar="PEM",
            help="serve the REST API over TLS (1.2+) with this certificate (chain after the leaf); needs --rest-tls-key")
    setting(w, "--rest-tls-key", kind=typed.TEXT, env="EOSINK_REST_TLS_KEY", default="", metavar="PEM",
            help="the private key of --rest-tls-cert (unencrypted PEM)")
    w.add_argument("--kafka-property", action="append", default=[], metavar="KEY=VALUE",
                   type=lambda v: typed.read(typed.KEY_VALUE, v, "--kafka-property"),
                   help="Kafka client setting for every consumer/producer/admin, e.g. security.protocol=SASL_SSL "
                        "(also EOSINK_KAFKA_SECURITY_PROTOCOL, EOSINK_KAFKA_SASL_USERNAME, EOSINK_KAFKA_SSL_CA_LOCATION, ...); "
                        "a value may be ${env:VAR} or ${file:/path:key}: sasl.password=${file:/run/secrets/kafka:password}")
    setting(w, "--audit-interval", kind=typed.COUNT, env="EOSINK_AUDIT_INTERVAL", default="0", metavar="SECONDS",
            help="the leader audits what was decided since its last round, every this many seconds (0 = off)")
    setting(w, "--audit-max-records", kind=typed.COUNT, env="EOSINK_AUDIT_MAX_RECORDS", default="100000",
            help="most records one continuous-audit round checks per connector (the rest waits for the next round)")
    setting(w, "--postgres-pool-size", kind=typed.COUNT, env="EOSINK_POSTGRES_POOL_SIZE", default="20",
            help="most connections this worker opens to one PostgreSQL database (server, database and role), shared by "
                 "all its postgres sinks (at least 2)")
    setting(w, "--log-level", kind=typed.LOG_LEVEL, env="EOSINK_LOG_LEVEL", default="INFO", help="log level")
    w.set_defaults(func=cmd_worker)

    from eosink.worker.clients.connectors_cmd import add_parser

    add_parser(sub)
    from eosink.worker.clients import cluster_cmd

    cluster_cmd.add_parser(sub, _zookeeper_args)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # read by eosink.worker.logging as soon as anything logs, in every subcommand: checked first
        typed.env("EOSINK_LOG_LEVEL", typed.LOG_LEVEL)
        typed.env("EOSINK_LOG_FORMAT", typed.choice("auto", "json", "console"))
        if argv and argv[0] == "stack":
            from eosink.worker.stack.cli import main as stack_main

            return stack_main(argv[1:])
        if argv and argv[0] == "spark":
            from eosink.spark_jobs.cli import main as spark_main

            return spark_main(argv[1:])
        if argv and argv[0] == "demo":
            if "--stream" in argv[1:]:
                from eosink.worker.stack.stream_demo import main as stream_demo_main

                return stream_demo_main(argv[1:])
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
