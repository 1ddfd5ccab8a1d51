"""Reference server for eosink's HTTP two-phase-commit protocol - the template for your own.

Run it::

    python -m eosink.connectors.http.reference_server --port 8080 --data-dir /var/lib/eosink-http [--token SECRET]

and point a connector at it: ``"connector.class": "http", "http.url": "http://host:8080"``.
Standard library only. Copy this file and replace :meth:`Store.apply_line` (here: append to a
JSON Lines log) with whatever "make it visible" means for you - keeping the rules below.

Protocol (every body and answer is JSON; ``{txn}`` is URL-quoted; any path prefix is allowed)::

    POST {base}/prepare/{txn}   body {"txn", "connector", "manifest": {"txn","connector","ranges":
                                [[topic, partition, first_offset, last_offset, epoch], ...]},
                                "records": [<value>, ...]}               (values in offset order
                                per partition, as the worker read them)
        200 {"status": "prepared"|"committed"}   durable before the answer; a repeat is a no-op
        409 {"error": "fenced", ...}             a range's epoch is older than one committed
        409 {"error": "aborted", ...}            the txn was aborted before this prepare landed
        400 / 401 / 413                          malformed, unauthorized, too large (not retried)
    POST {base}/commit/{txn}    200 {"status": "committed"}  also when already committed
                                404 unknown txn (never prepared here, or the prepared batch was lost)
    POST {base}/abort/{txn}     200 {"status": "aborted"}    also when unknown or already aborted
                                409 already committed (an abort never undoes a commit)
    GET  {base}/pending?connector=NAME
                                200 {"pending": [{"txn": ..., "manifest": {...}}, ...]}
    GET  {base}/ledger?connector=NAME
                                200 {"ledger": [{"txn": ..., "ranges": [[topic, partition, first_offset,
                                last_offset, epoch], ...], "records": N}, ...]}   every committed txn of
                                the connector as the store holds it now, in commit order, with how
                                many records it holds (optional: what ``eosink connectors audit``
                                reads back; an endpoint answering 404 here is reported NOT AUDITED)
    GET  {base}/health          200 {"status": "ok"}  (no auth)

Rules a server must keep, and how this one does:

* **Prepare is durable before it answers.** The body goes to ``prepared/<txn>.json`` through a
  temporary file, fsync, rename, fsync of the directory.
* **Commit is atomic and idempotent.** The commit point is one line appended to
  ``committed.jsonl`` (``{"txn","connector","manifest","records"}``) and fsynced. A crash mid-line
  leaves a torn tail that start-up truncates, so the txn is still prepared and the worker's retry
  commits it; a repeated commit finds the txn in the log and answers 200.
* **Remember committed txn ids** for as long as a commit may be retried (here: forever, read back
  from the log at start-up). Forgetting them would turn a retried commit into a 404.
* **Fence by epoch per (connector, topic, partition).** The highest epoch committed is kept; a
  prepare with an older one is refused with 409 - a zombie worker cannot make anything visible
  even if its ZooKeeper view is stale. Commit itself is never refused: the decision stands.
* **Answer 5xx only for transient trouble** (the worker retries 5xx, 408, 429 and timeouts; any
  other 4xx stops the connector and shows your response body to the operator).

Readers read ``committed.jsonl`` line by line; a line is a whole transaction or not there yet.
The ledger is read from the log on disk on every call (not from the in-memory state), so it
says what the store holds, including anything changed behind the server's back.
Start-up reads the log once to rebuild the committed txn ids and epochs (it parses only each
line's head, not its records), truncates a torn last line, and reloads ``prepared/``.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import re
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

_RECORDS = b',"records":'
_ROUTE = re.compile(r"^(?:.*)/(prepare|commit|abort)/([^/]+)$")


class ProtocolError(Exception):
    def __init__(self, status: int, error: str, detail: str = "") -> None:
        super().__init__(detail or error)
        self.status, self.error, self.detail = status, error, detail


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _head(line: bytes) -> dict[str, Any] | None:
    """txn, connector and manifest of a canonical line, without parsing its records."""
    if not line.startswith(b'{"txn":'):
        return None
    end = line.find(_RECORDS)  # json.dumps escapes every '"' inside strings: the first match is the key
    if end < 0:
        return None
    try:
        head = json.loads(line[:end] + b"}")
    except ValueError:
        return None
    return head if isinstance(head, dict) and set(head) == {"txn", "connector", "manifest"} else None


def _canonical(body: bytes, txn: str) -> tuple[bytes, dict[str, Any]]:
    """Validate a prepare body; return it as one canonical line (records last) and its head."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ProtocolError(400, "bad_request", f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"txn", "connector", "manifest", "records"}:
        raise ProtocolError(400, "bad_request", 'body must be {"txn", "connector", "manifest", "records"}')
    m = doc["manifest"]
    if doc["txn"] != txn or not isinstance(doc["connector"], str) or not isinstance(doc["records"], list):
        raise ProtocolError(400, "bad_request", "txn must match the URL; connector a string; records a list")
    if not isinstance(m, dict) or m.get("txn") != txn or m.get("connector") != doc["connector"] or not isinstance(m.get("ranges"), list):
        raise ProtocolError(400, "bad_request", "manifest must be {txn, connector, ranges} of this txn")
    for r in m["ranges"]:
        if not (isinstance(r, list) and len(r) == 5 and isinstance(r[0], str) and all(type(x) is int for x in r[1:])):
            raise ProtocolError(400, "bad_request", f"manifest range {r!r} is not [topic, partition, first, last, epoch]")
    head = {"txn": txn, "connector": doc["connector"], "manifest": m}
    if b"\n" not in body and _head(body) == head:
        return body, head  # the worker's bodies are canonical already: store them as they came
    line = json.dumps({**head, "records": doc["records"]}, separators=(",", ":")).encode()
    return line, head


def _append(src: int, dst: int, size: int, at: int) -> None:
    """Copy ``size`` bytes of ``src`` to ``dst`` at offset ``at``, in the kernel where it can."""
    done = 0
    while done < size:
        try:
            n = os.copy_file_range(src, dst, size - done, done, at + done)
        except OSError:  # not supported here (old kernel, some filesystems): copy by hand
            chunk = os.pread(src, min(size - done, 1 << 22), done)
            n = os.pwrite(dst, chunk, at + done)
        if n <= 0:
            raise OSError(f"short copy into the log at {at + done}")
        done += n


class Store:
    """The durable state: prepared batches as files, the committed log, per-partition epochs."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.prepared_dir = data_dir / "prepared"
        self.prepared_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / "committed.jsonl"
        self.lock = threading.Lock()
        self.prepared: dict[str, dict[str, Any]] = {}  # txn -> head
        self.committed: set[str] = set()
        self.aborted: set[str] = set()  # in memory: refuses a prepare that arrives after its abort
        self.epochs: dict[tuple[str, str, int], int] = {}
        self._load()
        # Not O_APPEND: commits are serialised by the lock and write at log_end themselves, so a
        # failed append can be cut off again (and copy_file_range refuses O_APPEND targets).
        self.log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.log_end = os.fstat(self.log_fd).st_size

    # -- start-up: rebuild the state from disk ------------------------------------------------
    def _load(self) -> None:
        if self.log_path.exists():
            with open(self.log_path, "r+b") as f:
                good = 0
                for line in f:
                    if not line.endswith(b"\n"):
                        break  # torn by a crash mid-append: that txn is still prepared
                    head = _head(line) or self._full_head(line)
                    self._committed(head)
                    good += len(line)
                if f.tell() != good:
                    f.truncate(good)
                    os.fsync(f.fileno())
        for path in self.prepared_dir.iterdir():
            if path.suffix == ".tmp":
                path.unlink()  # a prepare that never answered
                continue
            data = path.read_bytes()
            head = _head(data) or self._full_head(data)
            if head["txn"] in self.committed:
                path.unlink()  # crashed after the commit point, before removing the file
            else:
                self.prepared[head["txn"]] = head

    @staticmethod
    def _full_head(line: bytes) -> dict[str, Any]:
        doc = json.loads(line)
        return {"txn": doc["txn"], "connector": doc["connector"], "manifest": doc["manifest"]}

    def _committed(self, head: dict[str, Any]) -> None:
        self.committed.add(head["txn"])
        for topic, partition, _, _, epoch in head["manifest"]["ranges"]:
            key = (head["connector"], topic, partition)
            self.epochs[key] = max(self.epochs.get(key, -1), epoch)

    def _path(self, txn: str) -> Path:
        return self.prepared_dir / (quote(txn, safe="") + ".json")

    def _check_fence(self, head: dict[str, Any]) -> None:
        for topic, partition, _, _, epoch in head["manifest"]["ranges"]:
            seen = self.epochs.get((head["connector"], topic, partition), -1)
            if epoch < seen:
                raise ProtocolError(409, "fenced", f"epoch {epoch} for {topic}-{partition} is older than {seen} already committed")

    # -- the protocol -------------------------------------------------------------------------
    def prepare(self, txn: str, body: bytes) -> str:
        line, head = _canonical(body, txn)
        with self.lock:
            if txn in self.committed:
                return "committed"
            if txn in self.prepared:
                return "prepared"
            if txn in self.aborted:
                raise ProtocolError(409, "aborted", f"txn {txn} was aborted; a late prepare is refused")
            self._check_fence(head)
        path = self._path(txn)
        tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:  # written outside the lock: prepares of other txns go on
            f.write(line)
            f.write(b"\n")  # stored as the log line it becomes, so commit is a plain file append
            f.flush()
            os.fsync(f.fileno())
        with self.lock:
            try:
                if txn in self.aborted:  # the abort overtook this prepare: keep it aborted
                    raise ProtocolError(409, "aborted", f"txn {txn} was aborted while it was being prepared")
                self._check_fence(head)  # again: a commit may have raised an epoch meanwhile
            except ProtocolError:
                tmp.unlink()
                raise
            os.replace(tmp, path)
            _fsync_dir(self.prepared_dir)
            self.prepared[txn] = head
        return "prepared"

    def commit(self, txn: str) -> str:
        with self.lock:
            if txn in self.committed:
                return "committed"
            head = self.prepared.get(txn)
            if head is None:
                raise ProtocolError(404, "unknown_txn", f"txn {txn} was never prepared here (or its prepared batch was lost)")
            path = self._path(txn)
            self.apply_line(path)
            self._committed(head)
            del self.prepared[txn]
            path.unlink()
        return "committed"

    def apply_line(self, prepared: Path) -> None:
        """Make a prepared batch visible: here, its line appended to the log and fsynced (the
        commit point). Replace this with what "visible" means for your system."""
        pos = self.log_end
        try:
            with open(prepared, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                _append(src.fileno(), self.log_fd, size, pos)
            os.fsync(self.log_fd)
        except BaseException:
            os.ftruncate(self.log_fd, pos)  # never leave half a line for the next commit to follow
            raise
        self.log_end = pos + size

    def abort(self, txn: str) -> str:
        with self.lock:
            if txn in self.committed:
                raise ProtocolError(409, "already_committed", f"txn {txn} is committed; an abort never undoes a commit")
            self.prepared.pop(txn, None)
            self.aborted.add(txn)
            self._path(txn).unlink(missing_ok=True)
        return "aborted"

    def pending(self, connector: str | None) -> list[dict[str, Any]]:
        with self.lock:
            return [{"txn": t, "manifest": h["manifest"]} for t, h in sorted(self.prepared.items())
                    if connector is None or h["connector"] == connector]

    def ledger(self, connector: str | None) -> list[dict[str, Any]]:
        """Each committed txn of ``connector`` in the log on disk: its manifest ranges and record count."""
        data = self.log_path.read_bytes()
        out = []
        for line in data[:data.rfind(b"\n") + 1].splitlines():  # not a line being appended
            doc = json.loads(line)
            if connector is None or doc["connector"] == connector:
                out.append({"txn": doc["txn"], "ranges": doc["manifest"]["ranges"], "records": len(doc["records"])})
        return out

    def close(self) -> None:
        os.close(self.log_fd)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per worker, not one per request
    server: ReferenceServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path.endswith("/health"):
            return self._send(200, {"status": "ok"})
        if not self._authorized():
            return
        if url.path.endswith("/pending"):
            connector = parse_qs(url.query).get("connector", [None])[0]
            return self._send(200, {"pending": self.server.store.pending(connector)})
        if url.path.endswith("/ledger"):
            connector = parse_qs(url.query).get("connector", [None])[0]
            try:
                return self._send(200, {"ledger": self.server.store.ledger(connector)})
            except (OSError, ValueError, KeyError, TypeError) as exc:  # a log line no commit wrote
                return self._send(500, {"error": "ledger", "detail": f"{type(exc).__name__}: {exc}"})
        self._send(404, {"error": "not_found", "detail": url.path})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not self._authorized():  # before reading what may be a large body
            self.close_connection = True  # the unread body would be taken for the next request
            return
        if length > self.server.max_body:
            self.close_connection = True
            return self._send(413, {"error": "too_large", "detail": f"body over {self.server.max_body} bytes"})
        body = self.rfile.read(length)
        m = _ROUTE.match(urlsplit(self.path).path)
        if m is None:
            return self._send(404, {"error": "not_found", "detail": self.path})
        op, txn = m.group(1), unquote(m.group(2))
        store = self.server.store
        try:
            status = store.prepare(txn, body) if op == "prepare" else store.commit(txn) if op == "commit" else store.abort(txn)
        except ProtocolError as exc:
            return self._send(exc.status, {"error": exc.error, "detail": exc.detail, "txn": txn})
        except OSError as exc:  # disk trouble: transient for the worker, which retries
            return self._send(503, {"error": "storage", "detail": str(exc), "txn": txn})
        self._send(200, {"status": status, "txn": txn})

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return True
        self._send(401, {"error": "unauthorized", "detail": "missing or wrong 'Authorization: Bearer <token>'"})
        return False

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)


class ReferenceServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, *, token: str | None = None,
                 max_body: int = 512 * 1024 * 1024, verbose: bool = False) -> None:
        super().__init__(address, Handler)
        self.store, self.token, self.max_body, self.verbose = store, token, max_body, verbose


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="eosink HTTP 2PC reference server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--token", default=os.environ.get("EOSINK_HTTP_TOKEN"),
                    help="require 'Authorization: Bearer <token>' (default: $EOSINK_HTTP_TOKEN; unset: no auth)")
    ap.add_argument("--max-body-mb", type=int, default=512)
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = ap.parse_args(argv)
    store = Store(args.data_dir)
    server = ReferenceServer((args.host, args.port), store, token=args.token or None,
                             max_body=args.max_body_mb * 1024 * 1024, verbose=args.verbose)
    print(f"eosink http reference server on http://{args.host}:{server.server_address[1]} data {args.data_dir} "
          f"({len(store.prepared)} prepared, {len(store.committed)} committed)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
