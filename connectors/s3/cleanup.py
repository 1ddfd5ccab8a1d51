"""The ``.json`` of committed S3 txns, deleted several at a time in the background.

A committed txn's ``.json`` only tidies up: until it is gone, or after a crash, ``recover``
finds the txn complete and finishes it like any committed txn it finds (see :mod:`.protocol`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

import structlog

from eosink.connectors.s3.client import Bucket

#: Committed txns whose ``.json`` objects go in one DeleteObjects (one request, not one per commit).
CLEANUP_BATCH = 8
#: ... or fewer, once the oldest of them waited this long (a connector that commits rarely).
CLEANUP_AGE_S = 30.0


class Cleanup:
    """The committed txns' ``.json`` keys not deleted yet, and the background deletes of them."""

    def __init__(self, bucket: Bucket, connector: str, pool: ThreadPoolExecutor) -> None:
        self.bucket = bucket
        self.connector = connector
        self._pool = pool
        # .json keys of committed txns not deleted yet (see tidy), oldest first, and when the first came.
        self._committed: dict[str, None] = {}
        self._committed_since = 0.0
        self._cleanups: list[tuple[Future[None], list[str]]] = []  # background deletes and their keys

    def committed(self, key: str) -> None:
        """The txn of the ``.json`` at ``key`` is committed: its key goes with a later delete."""
        if not self._committed:
            self._committed_since = time.monotonic()
        self._committed[key] = None
        self.tidy()

    def tidy(self, force: bool = False) -> None:
        """Delete the ``.json`` of committed txns, several in one background DeleteObjects.

        The ``.json`` of a committed txn only tidies up, so it need not go at once: every
        :data:`CLEANUP_BATCH` commits (or :data:`CLEANUP_AGE_S`, or at close and recover) one
        request deletes them all instead of one request per commit. Until then, or after a crash,
        ``recover`` finds them complete and finishes them like any committed txn it finds.
        """
        self.reap()
        due = len(self._committed) >= CLEANUP_BATCH or time.monotonic() - self._committed_since >= CLEANUP_AGE_S
        if self._committed and (force or due):
            keys = list(self._committed)
            self._cleanups.append((self._pool.submit(self.bucket.delete, keys), keys))
            self._committed = {}

    def reap(self, block: bool = False) -> None:
        """Forget finished background cleanups (waiting for all with ``block``); a failed one is
        logged and its keys go with the next one: its txns are committed, and ``recover``
        finishes the cleanup of any an instance did not."""
        if block:
            wait([f for f, _ in self._cleanups])
        still: list[tuple[Future[None], list[str]]] = []
        for f, keys in self._cleanups:
            if not f.done():
                still.append((f, keys))
            elif f.exception() is not None:
                structlog.get_logger("eosink.s3").warning(
                    "cleanup_failed", connector=self.connector, bucket=self.bucket.name, error=str(f.exception()),
                    note="the txns are committed; the next cleanup or recover deletes their .json")
                if not self._committed:
                    self._committed_since = time.monotonic()
                self._committed.update(dict.fromkeys(keys))
        self._cleanups = still
