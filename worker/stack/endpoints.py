"""``<home>/endpoints.json``: how tests and workers find the running stack without knowing ports."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eosink.worker.stack.errors import StackError, StackNotRunning
from eosink.worker.stack.layout import StackLayout


@dataclass(frozen=True)
class Endpoints:
    """Addresses of the local stack; ``s3`` is ready to splat into ``boto3.client("s3", **s3)``."""

    kafka_bootstrap: str
    zookeeper_hosts: str
    postgres_dsn: str
    postgres_port: int
    s3: dict[str, str]


def load_endpoints(home: Path | None = None) -> Endpoints:
    """Read the endpoints written by ``eosink stack up`` for ``home`` (default: ``$EOSINK_HOME``)."""
    path = StackLayout.for_home(home).endpoints_file
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise StackNotRunning(
            f"the local stack is not running: {path} does not exist; run `eosink stack up` (or `make stack`)"
        ) from None
    try:
        return Endpoints(
            kafka_bootstrap=raw["kafka"]["bootstrap_servers"],
            zookeeper_hosts=raw["zookeeper"]["hosts"],
            postgres_dsn=raw["postgres"]["dsn"],
            postgres_port=int(raw["postgres"]["port"]),
            s3=dict(raw["s3"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise StackError(f"{path} is malformed ({e!r}); run `eosink stack up` to rewrite it") from None


def write_endpoints(layout: StackLayout, endpoints: dict[str, dict[str, Any]]) -> None:
    """Write atomically, so a reader never sees half a file while ``up`` runs."""
    layout.home.mkdir(parents=True, exist_ok=True)
    tmp = layout.endpoints_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(endpoints, indent=2) + "\n")
    os.replace(tmp, layout.endpoints_file)


def remove_endpoints(layout: StackLayout) -> None:
    layout.endpoints_file.unlink(missing_ok=True)
