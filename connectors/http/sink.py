"""HTTP sink: two-phase commit against an endpoint that speaks eosink's prepare/commit protocol.

The server side is specified - and implemented as a runnable template - in
:mod:`eosink.connectors.http.reference_server`. Per cycle::

    pre_commit   POST {http.url}/prepare/{txn}   one JSON body with the whole batch:
                 {"txn", "connector", "manifest": <TxnManifest JSON>, "records": [<value>, ...]}
    commit       POST {http.url}/commit/{txn}
    abort        POST {http.url}/abort/{txn}
    recover      GET  {http.url}/pending?connector=<name>  -> {"pending": [{"txn", "manifest"}]}
    audit        GET  {http.url}/ledger?connector=<name>   -> {"ledger": [{"txn", "ranges", "records"}]}
                 (optional; see :mod:`eosink.connectors.http.audit`)

**Why one JSON document (not NDJSON).** Every HTTP stack parses JSON bodies; the manifest
travels with the records it describes, so a server validates both in one place. The body is
built by joining bytes: object and array values are the record's bytes exactly as they were on
the topic (no re-encoding); other values (string converter, scalars) are JSON-encoded.
``records`` holds the values in the order the worker read them (offset order per partition);
the manifest gives each partition's offset range and epoch.

**Outcomes.** 2xx is ok. 5xx, 408, 429, connection errors and timeouts are retried in place
with exponential backoff (``Retry-After`` honoured, capped by ``http.retry.backoff.max.ms``) -
every call is idempotent on the server, so a repeat is harmless - and then raise
:class:`~eosink.connectors.api.errors.RetryableError`. 409 on prepare is the server's epoch fence:
:class:`~eosink.connectors.api.errors.FencedError`. Any other 4xx is :class:`~eosink.connectors.api.errors.FatalError`
with the response body in the message (a 404 on commit means the server lost a prepared txn).

Secrets (``http.auth.token``, ``http.headers.authorization``) are PASSWORD-typed: masked in
every config response, and never put in an error message.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

import urllib3

from eosink.connectors.api.config import ConfigDef, Importance, Type, at_least, non_empty
from eosink.connectors.api.errors import ConfigError, FatalError, FencedError, RetryableError
from eosink.connectors.api.records import LazyJsonRecord, SinkRecord, TxnManifest, json_document
from eosink.connectors.api.sink import BatchingSink

if TYPE_CHECKING:
    from eosink.connectors.http.audit import HttpReader

COMPONENT = "http"
_RETRY_STATUS = frozenset({408, 429})
_BODY_IN_ERROR = 2000  # characters of a response body quoted in an error


@dataclass(slots=True)
class CycleTimings:
    """Milliseconds of the last cycle's phases (for metrics and the benchmark)."""

    encode_ms: float = 0.0
    prepare_ms: float = 0.0  # the prepare round trip, retries included
    commit_ms: float = 0.0


def json_value(r: SinkRecord) -> bytes:
    return json_document(r, component=COMPONENT, needs="the HTTP sink sends JSON values")


def encode_body(manifest: TxnManifest, records: list[SinkRecord]) -> bytes:
    """``{"txn","connector","manifest","records"}`` as one line, records last (the server's canonical form)."""
    head = b'{"txn":%s,"connector":%s,"manifest":%s,"records":[' % (
        json.dumps(manifest.txn_id).encode(), json.dumps(manifest.connector).encode(), manifest.to_json().encode())
    fast, lazy = (dict, list), LazyJsonRecord  # copied_json inlined: this loop is most of the sink's CPU time
    values = [raw if (raw := r.raw_value) is not None and (r.__class__ is lazy or r.value.__class__ in fast)
              else json_value(r) for r in records]
    body = head + b",".join(values) + b"]}"
    if b"\n" in body:  # pretty-printed JSON on the topic: compact it so the body stays one line
        values = [json.dumps(json.loads(v), separators=(",", ":")).encode() if b"\n" in v else v for v in values]
        body = head + b",".join(values) + b"]}"
    return body


def redact(url: str) -> str:
    """``url`` without user:password, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"***@{host}" + (f":{parts.port}" if parts.port else "")))


class HttpSink(BatchingSink):
    """Exactly-once delivery to an HTTP endpoint implementing prepare/commit/abort/pending."""

    reads_values = False  # the body copies each value's JSON bytes (see TwoPhaseCommitSink.reads_values)

    CONFIG = (
        ConfigDef()
        .define("http.url", Type.STRING, doc="Base URL of the endpoint, e.g. https://api.example.com/eosink; the sink "
                "calls {http.url}/prepare/{txn}, /commit/{txn}, /abort/{txn} and /pending.",
                importance=Importance.HIGH, validator=non_empty)
        .define("http.auth.token", Type.PASSWORD, None, "Bearer token: sends 'Authorization: Bearer <token>'.", Importance.HIGH)
        .define("http.headers.authorization", Type.PASSWORD, None, "Whole Authorization header value (e.g. 'Basic ...'); "
                "exclusive with http.auth.token.", Importance.HIGH)
        .define("http.timeout.ms", Type.LONG, 30_000, "Read timeout per request (a prepare carries a whole batch).",
                validator=at_least(1))
        .define("http.connect.timeout.ms", Type.LONG, 5_000, "Connect timeout per request.", validator=at_least(1))
        .define("http.max.retries", Type.INT, 5, "Retries per call on 5xx, 408, 429, timeouts and connection errors, "
                "then the cycle fails as retryable.", validator=at_least(0))
        .define("http.retry.backoff.ms", Type.LONG, 100, "First backoff; doubles per retry (with jitter).", validator=at_least(0))
        .define("http.retry.backoff.max.ms", Type.LONG, 10_000, "Longest backoff between two attempts.", validator=at_least(0))
    )

    def audit_reader(self, name: str) -> HttpReader:
        """The endpoint read back through its ledger (see :mod:`eosink.connectors.http.audit`); an
        endpoint without one is reported NOT AUDITED, never clean."""
        from eosink.connectors.http.audit import HttpReader

        return HttpReader(name, self.base, self.connector, self._headers, self._timeout, redact(self.base))

    def __init__(self, connector: str, config: Mapping[str, Any], *, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(connector, config)
        c = self.config
        self.base = str(c["http.url"]).rstrip("/")
        if urlsplit(self.base).scheme not in ("http", "https"):
            raise ConfigError(f"must be an http:// or https:// URL, got {redact(self.base)!r}", key="http.url",
                              source=f"connector '{connector}'")
        if c["http.auth.token"] and c["http.headers.authorization"]:
            raise ConfigError("set either http.auth.token or http.headers.authorization, not both",
                              key="http.headers.authorization", source=f"connector '{connector}'")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         "User-Agent": f"eosink-http-sink/{connector}"}
        if c["http.auth.token"]:
            self._headers["Authorization"] = f"Bearer {c['http.auth.token']}"
        elif c["http.headers.authorization"]:
            self._headers["Authorization"] = str(c["http.headers.authorization"])
        self._timeout = urllib3.Timeout(connect=c["http.connect.timeout.ms"] / 1000, read=c["http.timeout.ms"] / 1000)
        self._pool: urllib3.PoolManager | None = None
        self._sleep = sleep
        self.attempts = 0  # requests sent, retries included (for tests and metrics)
        self.timings = CycleTimings()

    def open(self) -> None:
        """Build the connection pool; the first request connects (the server may start later)."""
        if self._pool is None:
            self._pool = urllib3.PoolManager(num_pools=2, maxsize=2, retries=False, timeout=self._timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.clear()
            self._pool = None

    # -- the protocol -----------------------------------------------------------------------
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        t0 = time.perf_counter()
        body = encode_body(manifest, records)
        t1 = time.perf_counter()
        resp = self._call("prepare", manifest.txn_id, body)
        self.timings = CycleTimings((t1 - t0) * 1000, (time.perf_counter() - t1) * 1000)
        if resp.status == 409:
            raise FencedError(f"prepare {manifest.txn_id} refused by {redact(self.base)}: {_text(resp)}", component=COMPONENT)
        self._check(resp, "prepare", manifest.txn_id)

    def commit(self, txn_id: str) -> None:
        t0 = time.perf_counter()
        resp = self._call("commit", txn_id, b"")
        self.timings.commit_ms = (time.perf_counter() - t0) * 1000
        if resp.status == 404:
            raise FatalError(f"commit {txn_id}: {redact(self.base)} does not know the txn - it was never prepared there or "
                             f"the server lost its prepared batch: {_text(resp)}", component=COMPONENT)
        self._check(resp, "commit", txn_id)

    def abort(self, txn_id: str) -> None:
        if self._txn_id == txn_id:
            self._batch = []
        self._check(self._call("abort", txn_id, b""), "abort", txn_id)

    def recover(self) -> list[TxnManifest]:
        url = f"{self.base}/pending?connector={quote(self.connector, safe='')}"
        resp = self._request("GET", url, None, "pending")
        self._check(resp, "recover", None)
        try:
            pending = json.loads(resp.data)["pending"]
            manifests = [TxnManifest.from_json(json.dumps(p["manifest"]), f"GET {redact(url)}") for p in pending]
        except (ValueError, KeyError, TypeError) as exc:
            raise FatalError(f"recover: GET {redact(url)} answered something other than "
                             f'{{"pending": [{{"txn", "manifest"}}]}}: {exc!r}: {_text(resp)}', component=COMPONENT) from None
        return [m for m in manifests if m.connector == self.connector]

    # -- plumbing ---------------------------------------------------------------------------
    def _call(self, op: str, txn_id: str, body: bytes) -> urllib3.BaseHTTPResponse:
        return self._request("POST", f"{self.base}/{op}/{quote(txn_id, safe='')}", body, f"{op} {txn_id}")

    def _check(self, resp: urllib3.BaseHTTPResponse, op: str, txn_id: str | None) -> None:
        if 200 <= resp.status < 300:
            return
        what = f"{op} {txn_id}" if txn_id else op
        raise FatalError(f"{what}: {redact(self.base)} answered HTTP {resp.status}: {_text(resp)}", component=COMPONENT)

    def _request(self, method: str, url: str, body: bytes | None, what: str) -> urllib3.BaseHTTPResponse:
        """One call with retries in place: returns the first non-retryable response."""
        if self._pool is None:
            self.open()
        assert self._pool is not None
        c = self.config
        retries = int(c["http.max.retries"])
        delay, cap = c["http.retry.backoff.ms"] / 1000, c["http.retry.backoff.max.ms"] / 1000
        last, wait = "", 0.0
        for attempt in range(retries + 1):
            if attempt:
                self._sleep(wait)  # set by the previous attempt: its backoff, or the server's Retry-After
                delay = min(cap, delay * 2)
            wait = random.uniform(delay / 2, delay)
            self.attempts += 1
            try:
                resp = self._pool.request(method, url, body=body, headers=self._headers, retries=False,
                                          timeout=self._timeout, preload_content=True)
            except urllib3.exceptions.HTTPError as exc:  # connect/read timeout, refused, reset, protocol
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status < 500 and resp.status not in _RETRY_STATUS:
                return resp
            last = f"HTTP {resp.status}: {_text(resp)}"
            after = resp.headers.get("Retry-After", "")
            if after.isdigit():
                wait = min(cap, max(wait, float(after)))
        raise RetryableError(f"{what}: {method} {redact(url)} failed after {retries + 1} attempts; last: {last}",
                             component=COMPONENT)


def _text(resp: urllib3.BaseHTTPResponse) -> str:
    text = resp.data.decode("utf-8", "replace").strip()
    return text if len(text) <= _BODY_IN_ERROR else text[:_BODY_IN_ERROR] + "..."

