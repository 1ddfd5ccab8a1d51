"""Soak: three workers and a transactional producer for 20 minutes, a random worker kill -9'd
about every 30 s, every worker's RSS and open fds sampled from /proc, then counted exactly-once.

    python bench/soak.py [--minutes 20] [--kill-every 30] [--sample-every 30] [--seed 1]
    make soak

Real processes on the local stack (``eosink stack up``), one PostgreSQL connector; the resource
curve is printed as it goes (one ``SOAK`` JSON line per sample) and summarised at the end. A leak
shows as the spared worker's RSS or fd count climbing between samples (``w3`` is never killed and
lives through every rebalance the kills cause), which a short test cannot see. The same loop runs
for 2 minutes in the suite (tests/test_faults.py).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faultkit import Rig, run_soak  # noqa: E402 - after the path set-up


def summary(curve: list[dict[str, Any]]) -> list[str]:
    """Per worker process: first and last RSS/fds while it lived, and the growth in between."""
    spans: dict[str, list[dict[str, Any]]] = {}
    for point in curve:
        for slot in ("w1", "w2", "w3"):
            entry = point.get(slot)
            if entry and entry["rss_mib"] is not None:
                spans.setdefault(entry["id"], []).append({"t": point["t"], **entry})
    lines = []
    for wid, points in spans.items():
        first, last = points[0], points[-1]
        peak = max(p["rss_mib"] for p in points)
        lines.append(f"{wid}: t={first['t']}..{last['t']}s rss {first['rss_mib']} -> {last['rss_mib']} MiB "
                     f"(peak {peak}), fds {first['fds']} -> {last['fds']}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills (+-20%%)")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between resource samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spare", default="w3", help="slot never killed, its curve spans the whole run ('' for none)")
    parser.add_argument("--pause", type=float, default=1.0,
                        help="seconds between the producer's 100-record transactions (1.0: ~75 committed records/s)")
    args = parser.parse_args()

    from confluent_kafka.admin import AdminClient

    from eosink.worker.stack import load_endpoints

    stack = load_endpoints()
    name = f"soak_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="eosink-soak-") as tmp:
        rig = Rig(kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
                  tmp=Path(tmp), name=name, files=False)
        try:
            curve = run_soak(rig, seconds=args.minutes * 60, kill_every=args.kill_every,
                             rng=random.Random(args.seed), sample_every=args.sample_every, pause=args.pause,
                             spare=args.spare or None)
        finally:
            rig.stop()
            AdminClient({"bootstrap.servers": stack.kafka_bootstrap}).delete_topics([rig.topic])
    print("SOAK resources per worker process:")
    for line in summary(curve):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
