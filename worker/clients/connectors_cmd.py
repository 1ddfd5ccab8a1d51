"""``eosink connectors ...``: the control plane from the command line, through a worker's REST API.

    eosink connectors [--url URL] apply FILE|DIR...     create or update (idempotent; all files validated first)
    eosink connectors list | plugins [--docs | --write-docs DIR]
    eosink connectors status [NAME] [--watch | --wait] [--json]  states; per partition: epoch, lag, delivered
    eosink connectors pause|resume|stop|delete NAME
    eosink connectors restart NAME [--include-tasks] [--only-failed]
    eosink connectors offsets NAME [--set TOPIC:PARTITION=OFFSET ...] [--reset]
    eosink connectors transactions NAME                 prepared / in-doubt transactions (the runbook's view)
    eosink connectors audit NAME [--offsets TOPIC:P=FROM-TO ...] [--json]
                                                        read every sink back against the outbox; exit 1 unless clean

``--url`` (``EOSINK_URL``, default http://127.0.0.1:8083); credentials from ``EOSINK_REST_BASIC_AUTH``
(USER:PASSWORD) or ``EOSINK_REST_TOKEN``, the same variables the worker reads, or from a file
(``EOSINK_REST_BASIC_AUTH_FILE``, ``EOSINK_REST_TOKEN_FILE``: its first line), and a value may be a
``${env:VAR}`` / ``${file:/path:key}`` reference. An https worker is verified against ``--rest-ca``
(``EOSINK_REST_CA``), else the system's trust store.

**Direct mode**, for bootstrapping a cluster before any worker serves REST: ``--zookeeper HOSTS``
(with ``--cluster``) makes ``apply``, ``list`` and ``delete`` write ZooKeeper directly, with the same
validation, as the workers' ZooKeeper principal (``--zookeeper-user``, ``EOSINK_ZOOKEEPER_PASSWORD``).
Every other action needs a worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from eosink.connectors.api.errors import EosinkError
from eosink.worker.clients import typed
from eosink.worker.clients.typed import setting

ACTIONS_DIRECT = ("apply", "list", "delete")


def _offset_spec(raw: str) -> tuple[str, int, int | None]:
    """``TOPIC:PARTITION=OFFSET`` (OFFSET may be null: back to consumer.auto.offset.reset)."""
    tp, sep, off = raw.rpartition("=")
    topic, sep2, part = tp.rpartition(":")
    if not sep or not sep2 or not topic or not part.isdigit() or not (off.isdigit() or off == "null"):
        raise ValueError(raw)
    return topic, int(part), None if off == "null" else int(off)


OFFSET_SPEC = typed.Kind(_offset_spec, "TOPIC:PARTITION=OFFSET (OFFSET a whole number, or null)")


def add_parser(sub: Any) -> None:
    c = sub.add_parser("connectors", help="register and manage connectors (through a worker's REST API)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    setting(c, "--url", kind=typed.URL, env="EOSINK_URL", help="worker REST URL (default http://127.0.0.1:8083)")
    setting(c, "--basic-auth", kind=typed.USER_PASSWORD, env="EOSINK_REST_BASIC_AUTH", metavar="USER:PASSWORD",
            help="HTTP basic credentials")
    setting(c, "--token", kind=typed.TEXT, env="EOSINK_REST_TOKEN", help="bearer token")
    setting(c, "--basic-auth-file", kind=typed.TEXT, env="EOSINK_REST_BASIC_AUTH_FILE", metavar="PATH",
            help="USER:PASSWORD from the first line of this file")
    setting(c, "--token-file", kind=typed.TEXT, env="EOSINK_REST_TOKEN_FILE", metavar="PATH", help="bearer token from this file")
    setting(c, "--rest-ca", kind=typed.TEXT, env="EOSINK_REST_CA", metavar="PEM",
            help="CA certificate that signed an https worker's certificate (default: the system's trust store)")
    setting(c, "--zookeeper", kind=typed.ZK_HOSTS, help="direct mode: write ZooKeeper instead of calling a worker (bootstrap)")
    setting(c, "--cluster", kind=typed.WORD, env="EOSINK_CLUSTER", default="default", help="direct mode: cluster name")
    from eosink.worker.clients import zk_auth

    zk_auth.add_args(c, zk_auth.stack_defaults())  # direct mode: the workers' ZooKeeper credentials
    c.add_argument("--bootstrap-servers", help=argparse.SUPPRESS)  # accepted for compatibility; unused
    a = c.add_subparsers(dest="action", required=True)
    p = a.add_parser("apply", help="create or update connectors from JSON files (or directories of them)")
    p.add_argument("files", nargs="+")
    a.add_parser("list", help="connector names")
    p = a.add_parser("status", help="connector and task states, per-partition lag and delivered counts")
    p.add_argument("name", nargs="?")
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    setting(p, "--interval", kind=typed.DURATION, default="2", help="with --watch: time between refreshes (2, 500ms, ...)")
    setting(p, "--count", kind=typed.COUNT, default="0", help="with --watch: stop after this many refreshes (0 = never)")
    p.add_argument("--wait", action="store_true",
                   help="refresh until every task is RUNNING and every partition has lag 0 (exit 1 after --timeout)")
    setting(p, "--timeout", kind=typed.DURATION, default="120", help="with --wait: give up after this long (120, 30s, 5m)")
    p.add_argument("--json", action="store_true")
    for action in ("pause", "resume", "stop", "delete", "transactions"):
        a.add_parser(action).add_argument("name")
    p = a.add_parser("restart")
    p.add_argument("name")
    p.add_argument("--include-tasks", action="store_true")
    p.add_argument("--only-failed", action="store_true")
    p = a.add_parser("offsets", help="show, alter (--set) or reset (--reset) offsets; the connector must be stopped to change them")
    p.add_argument("name")
    p.add_argument("--set", action="append", default=[], metavar="TOPIC:PARTITION=OFFSET",
                   type=lambda v: typed.read(OFFSET_SPEC, v, "--set"))
    p.add_argument("--reset", action="store_true")
    p = a.add_parser("audit", help="read each sink back and check it against the outbox (exit 1 unless clean)")
    p.add_argument("name")
    p.add_argument("--offsets", nargs="+", action="extend", default=[], metavar="TOPIC:P=FROM-TO",
                   help="audit these ranges only (TO exclusive); default: every partition, earliest to next_offset")
    p.add_argument("--json", action="store_true")
    p = a.add_parser("plugins", help="connector classes; --docs prints every configuration key as Markdown")
    p.add_argument("--docs", action="store_true")
    p.add_argument("--write-docs", metavar="DIR", help="rewrite the generated configuration pages under DIR (docs)")
    c.set_defaults(func=run)


def _files(paths: list[str]) -> Iterator[Path]:
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise EosinkError(f"{p}: no *.json files in this directory", component="cli")
            yield from found
        else:
            yield p


def run(args: argparse.Namespace) -> int:
    if args.action == "plugins" and (args.docs or args.write_docs):
        from eosink.worker.control import config_docs

        if args.write_docs:
            for page in config_docs.write_docs(Path(args.write_docs)):
                print(f"rewrote {page}")
        else:
            print(config_docs.render_markdown())
        return 0
    if args.zookeeper:
        if args.action not in ACTIONS_DIRECT:
            raise EosinkError(f"'{args.action}' needs a worker: pass --url instead of --zookeeper", component="cli")
        return _direct(args)
    from eosink.worker.clients.rest_client import RestClient

    return _rest(args, RestClient(args.url, basic=args.basic_auth, token=args.token, basic_file=args.basic_auth_file,
                                  token_file=args.token_file, ca=args.rest_ca or None))


def _direct(args: argparse.Namespace) -> int:
    from eosink.worker.clients import zk_auth
    from eosink.worker.control.config import load_connector_file
    from eosink.worker.control.store import ConnectorStore
    from eosink.worker.engine.zk import ZkSession

    configs = [load_connector_file(f, resolve=False) for f in _files(args.files)] if args.action == "apply" else []
    session = ZkSession(args.zookeeper, args.cluster, credentials=zk_auth.credentials(args), ca_file=zk_auth.ca_file(args)).start()
    try:
        store = ConnectorStore(session)
        if args.action == "apply":
            for cfg in configs:
                print(f"{'created' if store.put(cfg.name, cfg.raw) else 'updated'} connector {cfg.name}")
        elif args.action == "list":
            for name in store.names():
                print(name)
        elif not store.delete(args.name):
            raise EosinkError(f"connector {args.name!r} not found", component="cli")
        else:
            print(f"deleted connector {args.name}")
    finally:
        session.stop()
    return 0


def _rest(args: argparse.Namespace, client: Any) -> int:
    from eosink.worker.control.config import load_connector_file

    action = args.action
    if action == "apply":
        configs = [load_connector_file(f, resolve=False) for f in _files(args.files)]  # all valid before any write
        for cfg in configs:
            print(f"{'created' if client.put_config(cfg.name, cfg.raw) else 'updated'} connector {cfg.name}")
    elif action == "list":
        for name in client.names():
            print(name)
    elif action == "plugins":
        for p in client.request("GET", "/connector-plugins")[1]:
            print(f"{p['class']:40} {p['type']} {p.get('version', '')}")
    elif action == "status":
        _status(args, client)
    elif action in ("pause", "resume", "stop"):
        client.connector(args.name, action)
        print(f"{action} requested for connector {args.name}")
    elif action == "delete":
        client.request("DELETE", f"/connectors/{quote(args.name, safe='')}")
        print(f"deleted connector {args.name}")
    elif action == "restart":
        flags = [f"includeTasks={str(args.include_tasks).lower()}", f"onlyFailed={str(args.only_failed).lower()}"]
        status, body = client.connector(args.name, "restart", "POST", "?" + "&".join(flags))
        restarting = [t["id"] for t in (body or {}).get("tasks", []) if t["state"] == "RESTARTING"]
        print(f"restart requested for connector {args.name}" + (f": tasks {restarting}" if status == 202 else ""))
    elif action == "offsets":
        _offsets(args, client)
    elif action == "audit":
        return _audit(args, client)
    elif action == "transactions":
        body = client.connector(args.name, "transactions", "GET")[1]
        for t in body["transactions"]:
            print(f"{t['state']:9} {t['txn']}  partitions={','.join(t['partitions'])}  sinks={','.join(t.get('sinks', []))}"
                  + (f"  reason: {t['reason']}" if t.get("reason") else ""))
        for e in body.get("errors", []):
            print(f"warning: {e['sink']}: {e['message']}", file=sys.stderr)
        if not body["transactions"]:
            print("no prepared transactions")
    return 0


def _offsets(args: argparse.Namespace, client: Any) -> int:
    if args.reset and args.set:
        raise EosinkError("use either --set or --reset", component="cli")
    if args.reset:
        print(client.connector(args.name, "offsets", "DELETE")[1]["message"])
        return 0
    if args.set:
        items = [{"partition": {"kafka_topic": topic, "kafka_partition": part},
                  "offset": None if off is None else {"kafka_offset": off}} for topic, part, off in args.set]
        print(client.request("PATCH", f"/connectors/{quote(args.name, safe='')}/offsets", {"offsets": items})[1]["message"])
        return 0
    for o in client.connector(args.name, "offsets", "GET")[1]["offsets"]:
        print(f"{o['partition']['kafka_topic']}\t{o['partition']['kafka_partition']}\t{o['offset']['kafka_offset']}")
    return 0


def _audit(args: argparse.Namespace, client: Any) -> int:
    """Exit 0 only when the report is clean; the report names the culprits either way."""
    from eosink.worker.audit.render import lines
    from eosink.worker.audit.run import parse_range

    asked = [parse_range(r) for r in args.offsets]
    body = {"offsets": [{"kafka_topic": a.tp.topic, "kafka_partition": a.tp.partition, "from": a.first, "to": a.end}
                        for a in asked]} if asked else None
    client.timeout = max(client.timeout, 3600.0)  # a large connector's audit reads every sink whole
    report = client.request("POST", f"/connectors/{quote(args.name, safe='')}/audit", body)[1]
    print(json.dumps(report, indent=2) if args.json else "\n".join(lines(report)))
    return 0 if report["ok"] else 1


def _render(status: dict[str, Any]) -> list[str]:
    c = status["connector"]
    lines = [f"{status['name']}: {c['state']} (worker {c.get('worker_id') or '-'})"]
    for t in status["tasks"]:
        extra = f" [{t['eosink_state']}]" if t.get("eosink_state") else ""
        lines.append(f"  task {t['id']}: {t['state']}{extra} on {t['worker_id']}")
        if t.get("trace"):
            lines += [f"    {line}" for line in t["trace"].strip().splitlines()[-3:]]
        if t.get("retrying"):  # a fault being retried (a sink away, a full disk): what, where, for how long
            lines.append(f"    RETRYING {t['retrying']}")
        if t.get("partitions"):
            lines.append(f"    {'partition':32} {'epoch':>6} {'lag':>10} {'delivered':>12}")
            for p in t["partitions"]:
                lag = "-" if p.get("lag") is None else p["lag"]
                lines.append(f"    {p['partition']:32} {p.get('epoch') or '-':>6} {lag:>10} {p.get('delivered', 0):>12}")
        for u in t.get("unresolved", []):
            lines.append(f"    IN DOUBT {u['txn']} ({', '.join(u['partitions'])}): {u['reason']}")
    return lines


def behind(doc: dict[str, Any]) -> str | None:
    """Why the connector of status ``doc`` is not caught up (every task RUNNING, every partition read and
    at lag 0), or None when it is."""
    if doc["connector"]["state"] != "RUNNING":
        return f"connector {doc['name']} is {doc['connector']['state']}"
    parts = [p for t in doc["tasks"] for p in t.get("partitions", [])]
    for t in doc["tasks"]:
        if t["state"] != "RUNNING" or t.get("eosink_state"):
            return f"task {t['id']} is {t.get('eosink_state') or t['state']}"
    if not parts:
        return "no partition is assigned yet"
    lagging = [f"{p['partition']} (lag {'unknown' if p.get('lag') is None else p['lag']})" for p in parts if p.get("lag") != 0]
    return f"behind: {', '.join(lagging)}" if lagging else None


def _status(args: argparse.Namespace, client: Any) -> None:
    if args.wait:
        return _wait(args, client)
    refreshes = 0
    while True:
        names = [args.name] if args.name else client.names()
        docs = [client.status(n) for n in names]
        if args.json:
            print(json.dumps(docs[0] if args.name else docs, indent=2))
        else:
            if args.watch and sys.stdout.isatty():
                print("\x1b[2J\x1b[H", end="")
            if args.watch:
                print(time.strftime("%H:%M:%S"), client.url)
            for d in docs:
                print("\n".join(_render(d)))
            if not docs:
                print("no connectors")
        sys.stdout.flush()
        refreshes += 1
        if not args.watch or (args.count and refreshes >= args.count):
            return
        time.sleep(args.interval)


def _wait(args: argparse.Namespace, client: Any) -> None:
    """``status --wait``: poll until caught up, then print the status once; a timeout is an error naming
    what still lags (so a script can wait for delivery the way ``kubectl wait`` waits for a condition)."""
    deadline = time.monotonic() + args.timeout
    while True:
        names = [args.name] if args.name else client.names()
        docs = [client.status(n) for n in names]
        reasons = [r for r in map(behind, docs) if r]
        if docs and not reasons:
            break
        if time.monotonic() >= deadline:
            raise EosinkError(f"not caught up after {args.timeout:g} s: {'; '.join(reasons) or 'no connectors'}",
                              component="cli")
        time.sleep(0.5)
    print(json.dumps(docs[0] if args.name else docs, indent=2) if args.json else "\n".join(
        line for d in docs for line in _render(d)))
