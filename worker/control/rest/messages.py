"""What a REST handler takes and gives: :class:`Request`, :class:`Response`, :class:`ApiError`.

Kept apart from the handlers so that the server, the routing table and every handler module share
one vocabulary without importing each other; also the check every connector config body gets.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """A request that gets Kafka Connect's error body: ``{"error_code": status, "message": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class Request:
    method: str
    path: str
    params: dict[str, str]
    query: dict[str, list[str]]
    body: bytes = b""

    def json(self) -> Any:
        if not self.body.strip():
            raise ApiError(400, "a JSON request body is required")

        def no_constants(c: str) -> Any:
            raise ValueError(f"{c} is not valid JSON")

        try:
            return json.loads(self.body, parse_constant=no_constants)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}") from None

    def flag(self, name: str, default: bool = False) -> bool:
        values = self.query.get(name)
        if not values:
            return default
        v = values[-1].strip().lower()
        if v not in ("true", "false"):
            raise ApiError(400, f"query parameter {name} must be true or false, got {values[-1]!r}")
        return v == "true"


@dataclass
class Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    content_type: str = "application/json"


def check_config_values(config: dict[str, Any]) -> None:
    """Connect configs are string maps; eosink also takes numbers, booleans and lists of those."""
    for k, v in config.items():
        if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v)):
            raise ApiError(400, f"Connector configuration is invalid: key '{k}': a value must be a string, number, "
                                "boolean or list, not an object")
        if isinstance(v, float) and not math.isfinite(v):
            raise ApiError(400, f"Connector configuration is invalid: key '{k}': not a finite number")
