"""``eosink stack up|down|status`` (also ``python -m eosink.worker.stack``): never a bare traceback.

Errors from the stack are printed as their one-paragraph message and exit 1; set
``EOSINK_DEBUG=1`` to get the traceback of an unexpected error instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from eosink.worker.stack import manager
from eosink.worker.stack.components import COMPONENTS
from eosink.worker.stack.errors import StackError
from eosink.worker.stack.layout import StackLayout


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = _names(args.only)
    try:
        if args.command == "up":
            statuses = manager.up(names, report=_progress, brokers=args.kafka_brokers, secure=args.secure or None,
                                  zookeeper_nodes=args.zookeeper_nodes)
        elif args.command == "down":
            manager.down(names, report=_progress)
            statuses = manager.status(names)
        else:
            statuses = manager.status(names)
    except StackError as e:
        print(f"eosink stack {args.command} failed:\n{e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"eosink stack {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI promises a readable message, not a traceback
        if os.environ.get("EOSINK_DEBUG"):
            raise
        print(f"eosink stack {args.command} failed unexpectedly: {type(e).__name__}: {e} "
              "(set EOSINK_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
    _print(statuses, as_json=args.json)
    if args.command == "down":
        return 0 if all(s.state == "stopped" for s in statuses) else 1
    return 0 if all(s.state == "running" for s in statuses) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eosink stack",
        description="The local stack (ZooKeeper, Kafka, PostgreSQL, S3) on 127.0.0.1, under $EOSINK_HOME/stack "
                    "(default ./.eosink/stack). Ports: EOSINK_ZOOKEEPER_PORT, EOSINK_KAFKA_PORT, "
                    "EOSINK_KAFKA_CONTROLLER_PORT, EOSINK_POSTGRES_PORT, EOSINK_S3_PORT. With --kafka-brokers N, "
                    "Kafka node i uses EOSINK_KAFKA_PORT+2(i-1) and EOSINK_KAFKA_CONTROLLER_PORT+2(i-1). With "
                    "--zookeeper-nodes N, ZooKeeper node i serves clients on EOSINK_ZOOKEEPER_PORT+(i-1) and talks to its "
                    "peers on EOSINK_ZOOKEEPER_PORT+10+(i-1) (quorum) and +20+(i-1) (election).",
    )
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    parser.add_argument("--kafka-brokers", type=int, metavar="N",
                        help="up: run N Kafka nodes (KRaft combined mode, replication factor 3, min.insync.replicas 2 "
                             "when N>=3); default EOSINK_KAFKA_BROKERS, else what this home ran last, else 1")
    parser.add_argument("--zookeeper-nodes", type=int, metavar="N", choices=(1, 3, 5),
                        help="up: run a ZooKeeper ensemble of N nodes (1, 3 or 5) on loopback; endpoints.json's "
                             "zookeeper.hosts lists them all; default EOSINK_ZOOKEEPER_NODES, else what this home ran "
                             "last, else 1 (one standalone server)")
    parser.add_argument("--secure", action="store_true",
                        help="up: make this home a locked-down stack (Kafka SASL/SCRAM over TLS with ACLs, ZooKeeper "
                             "digest ACLs, PostgreSQL scram-sha-256 over TLS with a least-privilege role, MinIO over "
                             "TLS with a one-bucket user, the Schema Registry over TLS with basic auth) on ports 100 "
                             "above the open stack's; later commands on the home need no flag. Secrets: "
                             "<home>/stack/secrets")
    parser.add_argument("--only", action="append", metavar="COMPONENT",
                        help=f"act on these components only (repeat or comma-separate; {', '.join(COMPONENTS)})")
    return parser


def _names(only: list[str] | None) -> list[str] | None:
    if not only:
        return None
    return [name.strip() for item in only for name in item.split(",") if name.strip()]


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print(statuses: list[manager.ComponentStatus], as_json: bool) -> None:
    layout = StackLayout.for_home()
    if as_json:
        print(json.dumps({
            "home": str(layout.home),
            "secure": layout.secure,
            "endpoints_file": str(layout.endpoints_file),
            "all_running": all(s.state == "running" for s in statuses),
            "components": {s.name: s.to_json() for s in statuses},
        }, indent=2))
        return
    rows = [("component", "state", "pid", "endpoint", "log")]
    rows += [(s.name, s.state, str(s.pid or "-"), s.address, _short(str(s.log))) for s in statuses]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if layout.endpoints_file.exists():
        print(f"endpoints: {_short(str(layout.endpoints_file))}")


def _short(path: str) -> str:
    """Paths under the working directory print relative: the table stays readable."""
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path
