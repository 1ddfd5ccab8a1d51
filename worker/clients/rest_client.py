"""A small client of the worker REST API for ``eosink connectors``.

Stdlib ``urllib`` only: the CLI runs wherever the worker is installed, with nothing more, and a
failed call becomes one :class:`ApiFailure` naming the URL and the worker's Connect-shaped message.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from eosink.connectors.api.errors import EosinkError
from eosink.worker.control.rest.auth import client_header

DEFAULT_URL = "http://127.0.0.1:8083"


class ApiFailure(EosinkError):
    """The worker answered with an error (``status`` and Connect's ``message``)."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"{message} (HTTP {status} from {url})", component="rest")
        self.status = status
        self.api_message = message


class RestClient:
    def __init__(self, url: str | None = None, *, basic: str | None = None, token: str | None = None,
                 timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get("EOSINK_URL") or DEFAULT_URL).rstrip("/")
        self.auth = client_header(basic if basic is not None else os.environ.get("EOSINK_REST_BASIC_AUTH"),
                                  token if token is not None else os.environ.get("EOSINK_REST_TOKEN"))
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.auth:
            req.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw).get("message", raw.decode(errors="replace"))
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace") or exc.reason
            raise ApiFailure(exc.code, str(message), self.url + path) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EosinkError(f"cannot reach the worker at {self.url}: {reason} (set --url or EOSINK_URL)",
                              component="rest") from None

    # -- the calls the CLI makes --------------------------------------------------------------
    def put_config(self, name: str, config: dict[str, Any]) -> bool:
        """Create or update; True when created."""
        status, _ = self.request("PUT", f"/connectors/{quote(name, safe='')}/config", config)
        return status == 201

    def names(self) -> list[str]:
        return self.request("GET", "/connectors")[1]

    def status(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/connectors/{quote(name, safe='')}/status")[1]

    def connector(self, name: str, action: str, method: str = "PUT", query: str = "") -> tuple[int, Any]:
        return self.request(method, f"/connectors/{quote(name, safe='')}/{action}{query}")
