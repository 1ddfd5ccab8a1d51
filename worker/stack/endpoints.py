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
    """Addresses of the local stack; ``s3`` is ready to splat into ``boto3.client("s3", **s3)``.

    ``security`` is set for a secure stack only: ``ca_file`` (the stack's CA, what every client
    trusts) and ``credentials_file`` (the generated passwords, see :mod:`eosink.worker.stack.secure`).
    """

    kafka_bootstrap: str
    zookeeper_hosts: str
    postgres_dsn: str
    postgres_port: int
    s3: dict[str, str]
    security: dict[str, str] | None = None
    #: The Schema Registry's Confluent-compatible URL (an open stack's; None when the stack runs none).
    registry_url: str | None = None
    raw: dict[str, Any] | None = None

    @property
    def secure(self) -> bool:
        return self.security is not None


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
            security=dict(raw["security"]) if "security" in raw else None,
            registry_url=raw["registry"]["url"] if "registry" in raw else None,
            raw=raw,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise StackError(f"{path} is malformed ({e!r}); run `eosink stack up` to rewrite it") from None


def write_endpoints(layout: StackLayout, endpoints: dict[str, dict[str, Any]]) -> None:
    """Write atomically, so a reader never sees half a file while ``up`` runs."""
    layout.home.mkdir(parents=True, exist_ok=True)
    tmp = layout.endpoints_file.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if layout.secure else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(endpoints, indent=2) + "\n")
    os.replace(tmp, layout.endpoints_file)


def remove_endpoints(layout: StackLayout) -> None:
    layout.endpoints_file.unlink(missing_ok=True)
