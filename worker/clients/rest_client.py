"""A small client of the worker REST API for ``eosink connectors``.

Stdlib ``urllib`` only: the CLI runs wherever the worker is installed, with nothing more, and a
failed call becomes one :class:`ApiFailure` naming the URL and the worker's Connect-shaped message.
An https URL is always verified (against ``--rest-ca`` / ``EOSINK_REST_CA`` when given, else the
system's trust store); a certificate it cannot verify and a refused credential are each one line
naming the setting to fix.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from eosink.connectors.api.errors import EosinkError
from eosink.worker.control.rest.auth import CLI_NAMES, CredentialNames, client_header, credentials
from eosink.worker.control.rest.tls import CA_SETTING, client_context

DEFAULT_URL = "http://127.0.0.1:8083"


class ApiFailure(EosinkError):
    """The worker answered with an error (``status`` and Connect's ``message``)."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"{message} (HTTP {status} from {url})", component="rest")
        self.status = status
        self.api_message = message


class RestClient:
    def __init__(self, url: str | None = None, *, basic: str | None = None, token: str | None = None,
                 basic_file: str | None = None, token_file: str | None = None, ca: str | None = None,
                 timeout: float = 30.0, names: CredentialNames = CLI_NAMES) -> None:
        self.url = (url or os.environ.get("EOSINK_URL") or DEFAULT_URL).rstrip("/")
        env = os.environ.get
        if (basic, token, basic_file, token_file) == (None, None, None, None):
            basic, token = env("EOSINK_REST_BASIC_AUTH"), env("EOSINK_REST_TOKEN")
            basic_file, token_file = env("EOSINK_REST_BASIC_AUTH_FILE"), env("EOSINK_REST_TOKEN_FILE")
        pair, tok = credentials(basic, token, basic_file, token_file, names=names)
        self.auth = client_header(pair, tok)
        #: the setting a refused credential came from, for the 401 line (the token wins when both are set)
        self._credential_names = (names.token_file if token_file else names.token) if tok else \
            (names.basic_file if basic_file else names.basic) if pair else ""
        self.ca = ca if ca is not None else env("EOSINK_REST_CA") or None
        self.context: ssl.SSLContext | None = client_context(self.ca) if self.url.startswith("https://") else None
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
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw).get("message", raw.decode(errors="replace"))
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace") or exc.reason
            if exc.code == 401:
                message = (f"the worker refused the credentials of {self._credential_names}" if self._credential_names else
                           f"the worker requires credentials: set {CLI_NAMES.basic} (or {CLI_NAMES.basic_file}) "
                           f"or {CLI_NAMES.token}")
            raise ApiFailure(exc.code, str(message), self.url + path) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                hint = f"the CA given by {CA_SETTING} ({self.ca})" if self.ca else f"no {CA_SETTING} given"
                raise EosinkError(f"cannot verify the TLS certificate of the worker at {self.url}: "
                                  f"{reason.verify_message or reason.reason}; {hint}: pass the CA that signed it with {CA_SETTING}",
                                  component="rest") from None
            if isinstance(reason, ssl.SSLError):
                raise EosinkError(f"TLS with the worker at {self.url} failed: {reason.reason or reason} (is it serving https? "
                                  f"check --url / EOSINK_URL and {CA_SETTING})", component="rest") from None
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
