"""Where records come from: a read_committed Kafka consumer with a batch poll.

The engine (``eosink.worker.engine.task``) sees only :class:`~eosink.worker.engine.batch.RecordSource`, so
the deterministic model tests can drive the same commit cycle from an in-memory source.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from eosink.connectors.api.errors import FatalError, RecordError, RetryableError
from eosink.connectors.api.records import UNDECODED, LazyJsonRecord, SinkRecord, TopicPartition
from eosink.connectors.api.rows import NativeRowTarget, RowRecord
from eosink.connectors.common.jsoncodec import EnvelopeCutter
from eosink.worker import native as native_records
from eosink.worker.engine import gcpause
from eosink.worker.engine.avro_rows import AvroRows
from eosink.worker.engine.batch import MAX_FAILED_PER_BATCH, Batch, FailedRecord
from eosink.worker.engine.converters import CONVERTERS, REGISTRY_FORMATS, converter, json_checked, json_value
from eosink.worker.engine.kafka_errors import ConnectionWatch, authorization_error
from eosink.worker.engine.progress import SourceProgress
from eosink.worker.engine.stall import StallWatch

#: SinkRecord's slots, in field order, for the C loop (worker/native/_records.c).
_SLOTS = tuple(SinkRecord.__dict__[f.name] for f in dataclasses.fields(SinkRecord))
#: What a connector's consumer overrides may not change: these keep read_committed delivery and the
#: decision log's ownership of offsets (registration refuses them too; this is the second line).
#: ``enable.partition.eof`` is on so the source knows when it has read everything available (see
#: :meth:`KafkaSource.caught_up`); the end-of-partition events never reach the sinks.
PINNED = {"isolation.level": "read_committed", "enable.auto.commit": False, "enable.auto.offset.store": False,
          "enable.partition.eof": True}
#: ``on_chunk`` receives the records decoded so far once this many wait; the first chunk of a batch whose sink offers
#: rows but has none yet, at the second: its stream opens with it, and the records after it become rows, not dicts.
CHUNK_RECORDS, FIRST_CHUNK_RECORDS = 20_000, 1_000

class KafkaSource(SourceProgress):
    """A confluent-kafka consumer with a manual assignment (ZooKeeper assigns, not the group).

    ``group.id`` is still set (``eosink-<connector>``), so offsets committed best effort after
    each cycle show up in ordinary Kafka tooling as consumer lag.
    """

    #: Takes ``min_s`` and ``on_chunk`` (see :class:`~eosink.worker.engine.batch.RecordSource`).
    incremental = True

    def __init__(
        self,
        connector: str,
        bootstrap: str,
        *,
        value_converter: str = "json",
        reset: str = "earliest",
        overrides: Mapping[str, Any] | None = None,
        fetch_batch: int = 10_000,
        tolerate: bool = False,
        key_converter: str = "bytes",
        schemas_enable: bool = False,
        value_registry: Mapping[str, Any] | None = None,
        key_registry: Mapping[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer

        self.connector = connector
        self.bootstrap = bootstrap
        #: errors.tolerance=all: an undecodable record goes to ``Batch.failed`` and the batch goes on.
        self.tolerate = tolerate
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": f"eosink-{connector}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": reset,
            "statistics.interval.ms": 0,
            "fetch.wait.max.ms": 100,
            "queued.min.messages": 200_000,
            # librdkafka postpones a partition's next fetch by this long whenever its prefetch queue
            # is over the thresholds above - 1000 ms by default, which stalls a consumer that drains
            # the queue quickly: measured here, 0.39M records/s with the default against 1.7-1.9M
            # with 10-50 ms (bench/bench_worker.py). A short back-off only re-checks the queue sooner.
            "fetch.queue.backoff.ms": 20,
        }
        conf.update(overrides or {})
        conf.update(PINNED)
        self.settings = {k: v for k, v in conf.items() if k in ("bootstrap.servers", "sasl.username", "sasl.mechanism",
                                                                 "ssl.ca.location", "security.protocol")}
        #: A refused login or TLS handshake reaches only the error callback; poll_batch raises it (fatal).
        self.watch = ConnectionWatch(self.settings, "kafka-consumer")
        #: An ACL refusal seen outside a fetch (the group commit's GROUP_AUTHORIZATION_FAILED, an assigned
        #: topic's metadata), raised by the next poll_batch.
        self._commit_refused: Exception | None = None
        conf["on_commit"] = self._on_commit
        self.group = str(conf["group.id"])
        self.consumer = Consumer(self.watch.install(conf))
        try:
            #: Kafka Connect's ``schemas.enable`` envelope: each value's payload is cut out of its bytes
            #: (``envelope_payload``) and then read as a schemaless JSON value is, bytes and all; an
            #: envelope that cannot be cut natively is decoded whole (``unwrap_whole``), without bytes.
            self.envelope = schemas_enable and value_converter == "json"
            self.unwrap_whole = converter(value_converter, schemas_enable=schemas_enable, registry=value_registry)
            self.decode = json_value if self.envelope else self.unwrap_whole
            self.converter = value_converter
            #: Keys are decoded only when asked (bytes: the key as it was on the topic).
            self.decode_key = None if key_converter == "bytes" else converter(key_converter, registry=key_registry)
            self.key_converter = key_converter
        except KeyError:
            raise FatalError(f"unknown converter {value_converter!r}/{key_converter!r}; one of {', '.join(CONVERTERS)}",
                             component="config") from None
        #: The raw value is handed on only when it is the decoded value's own encoding (sinks then copy it).
        self.keep_raw = (self.envelope or not schemas_enable) and value_converter not in REGISTRY_FORMATS
        self.fetch_batch = fetch_batch
        # No decision yet: start where the reset policy says - never at the group's committed offset, which
        # is only a best-effort copy for Kafka tooling and may be stale (e.g. after the offsets were reset).
        self._reset_to = OFFSET_BEGINNING if reset == "earliest" else OFFSET_END
        self._from_start = reset == "earliest"
        self._pending: list[Any] = []
        #: Set by the task to end the flush in progress early (stop requested, assignment changed).
        self.interrupt = threading.Event()
        self._assigned: list[TopicPartition] = []
        #: Where each partition was assigned from: its position until librdkafka reports one (it does
        #: only once a message was consumed; a partition blocked from its first offset has none).
        self._start: dict[TopicPartition, int] = {}
        self.stalls = StallWatch()
        #: time.monotonic() when the first records arrived after the last assign() (None: not yet):
        #: how long a new owner waits for data, and where a benchmark starts a steady-state clock.
        self.first_record_at: float | None = None
        self._known_topics: set[str] = set()
        #: Assigned partitions whose end (the last stable offset) was reached and nothing read since.
        self._at_end: set[tuple[str, int]] = set()
        #: The last batch's records, freed a slice at a time while the next batch is decoded (see _poll_batch).
        self._last: list[SinkRecord] = []
        #: Avro values decoded into the only sink's native rows, when it offers them (see poll_batch).
        self._avro_rows: AvroRows | None = None

    def defer_json_decoding(self) -> bool:
        """Check JSON object and array values as they are read but decode them only when read
        (:class:`LazyJsonRecord`): for a task whose sinks all copy the values' bytes and that has no
        transforms. True when it applies (``value.converter=json``, the ``schemas.enable`` envelope's payloads too)."""
        if self.converter != "json" or not self.keep_raw:
            return False
        self.decode = json_checked
        return True

    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        from confluent_kafka import TopicPartition as KTP

        self._pending = []
        self._last = []
        self._assigned = sorted(positions)
        self._start = {tp: off for tp, off in positions.items() if off is not None}
        self._at_end = set()
        self.first_record_at = None
        self._learn_topics({tp.topic for tp in positions})
        self.consumer.assign(
            [KTP(tp.topic, tp.partition, self._reset_to if off is None else off) for tp, off in sorted(positions.items())]
        )

    def _learn_topics(self, topics: set[str]) -> None:
        """Ask for the metadata of topics this consumer has not assigned before. Without it the
        new topics' leaders were sometimes learnt only by librdkafka's next periodic scan: the
        first records then came ~0.7 s after the assignment instead of ~10 ms (seen in 3 of 6
        tries), which is that much longer a handoff."""
        from confluent_kafka import KafkaException

        for topic in sorted(topics - self._known_topics):
            try:
                tmd = self.consumer.list_topics(topic, timeout=2).topics.get(topic)
            except KafkaException:
                continue  # assign anyway: librdkafka learns the leaders on its own, only later
            # An assigned topic the ACLs hide is not reported by the fetcher: it just waits for a leader
            # that never comes. The metadata answer is the only place the refusal shows: the next poll raises it.
            refused = authorization_error(tmd.error if tmd is not None else None, self.settings, "READ", topic,
                                          component="kafka-consumer", resource_type="topic")
            if refused is not None:
                self._commit_refused = self._commit_refused or refused
                continue
            self._known_topics.add(topic)

    def _on_commit(self, err: Any, _partitions: Any) -> None:
        """The group commit is best effort (the decision log is the truth), but a refusal by the ACLs is
        a misconfiguration an operator must fix, not a hiccup: remember it, the next poll raises it."""
        refused = authorization_error(err, self.settings, "READ", self.group, component="kafka-consumer",
                                      detail="committing the consumer group's offsets")
        if refused is not None and self._commit_refused is None:
            self._commit_refused = refused

    def _raise_refusals(self) -> None:
        """Raise what the callbacks saw: a refused group commit, a refused login or TLS handshake."""
        if self._commit_refused is not None:
            raise self._commit_refused
        self.watch.check()

    def _error(self, m: Any, err: Any) -> Exception:
        """A consumer error as an eosink error: ACL refusals and failed logins are fatal, the rest is retried."""
        group = err.name() == "GROUP_AUTHORIZATION_FAILED"  # the consumer looks up its group's coordinator
        refused = authorization_error(err, self.settings, "READ", self.group if group else m.topic() or "?",
                                      component="kafka-consumer")
        if refused is not None:
            return refused
        if err.fatal():
            return FatalError(f"consumer error from Kafka at {self.bootstrap}: {err}", component="kafka-consumer")
        return RetryableError(f"consumer error from Kafka at {self.bootstrap}: {err}", component="kafka-consumer")

    def poll_batch(self, max_records: int, max_bytes: int, timeout_s: float, *, min_s: float | None = None,
                   on_chunk: Callable[[list[SinkRecord]], None] | None = None,
                   rows: Callable[[], Callable[[bytes], Any] | None] | None = None,
                   native: Callable[[], NativeRowTarget | None] | None = None,
                   min_fill: tuple[int, int] | None = None) -> Batch:
        """Read up to ``max_records`` / ``max_bytes`` for at most ``timeout_s``.

        ``min_s``: return as soon as everything available has been read (:meth:`caught_up`) and the
        poll is at least this old - waiting out ``timeout_s`` for records that do not come only
        delays them. ``min_fill`` (records, bytes): return as soon as everything available has been
        read and the batch holds at least this many records or bytes, however young.
        ``on_chunk``: called with each slice of the batch's records (in order, every
        record once) as they are decoded, so a sink can start writing while the rest is read. ``rows``:
        the only sink's ``row_decoder`` (:class:`eosink.connectors.api.rows.RowDecoding`), asked once
        per fetched slice; a JSON value it decodes becomes a :class:`RowRecord`, any other is decoded
        by the converter as without it. ``native``: the only sink's ``native_row_target``
        (:class:`eosink.connectors.api.rows.NativeRowDecoding`), used instead with ``value.converter=avro``."""
        gcpause.pause()
        try:
            batch = self._poll_batch(max_records, max_bytes, timeout_s, min_s, on_chunk, rows, native, min_fill)
            batch.fresh = True  # every record in it was decoded anew, for this batch alone
            return batch
        finally:
            gcpause.resume()

    def _poll_batch(self, max_records: int, max_bytes: int, timeout_s: float, min_s: float | None = None,
                    on_chunk: Callable[[list[SinkRecord]], None] | None = None,
                    rows: Callable[[], Callable[[bytes], Any] | None] | None = None,
                    native: Callable[[], NativeRowTarget | None] | None = None,
                    min_fill: tuple[int, int] | None = None) -> Batch:
        from confluent_kafka import KafkaError

        if self._commit_refused is not None:
            raise self._commit_refused  # before anything is consumed: the cycle aborts with nothing read
        batch = Batch()
        out = batch.records
        append = out.append
        last = self._last
        decode, decode_key, keep_raw = self.decode, self.decode_key, self.keep_raw
        unwrap = EnvelopeCutter() if self.envelope else None
        unwrap_whole = self.unwrap_whole
        if not keep_raw or decode is not json_value:
            rows = None  # a row stands for the value only where the value is the JSON of raw_value
        #: A Schema Registry converter: each record carries the writer's schema it was decoded with.
        registry: Any = decode if self.converter in REGISTRY_FORMATS else None
        row_class: type[SinkRecord] = RowRecord
        if native is not None and self.converter == "avro" and unwrap is None:
            if self._avro_rows is None or self._avro_rows.target_of != native:
                self._avro_rows = AvroRows(decode, native)
            rows, row_class = self._avro_rows, self._avro_rows.record_class
        row = rows() if rows is not None else None
        # The C loop (worker/native/_records.c) where it builds exactly what the loop below would: a JSON
        # value's row, no envelope, key or registry to handle.
        fill = native_records.filler() if rows is not None and row_class is RowRecord and unwrap is None \
            and decode_key is None and registry is None else None
        started = time.monotonic()
        deadline = started + timeout_s
        early = started + min_s if min_s is not None and min_s < timeout_s else None
        at_end = self._at_end
        nbytes = 0
        handed = 0  # records already given to on_chunk
        polled = False
        while len(out) < max_records and nbytes < max_bytes and len(batch.failed) < MAX_FAILED_PER_BATCH:
            first = handed == 0 and rows is not None and row is None  # (the sink has no rows yet)
            if on_chunk is not None and len(out) - handed >= (FIRST_CHUNK_RECORDS if first else CHUNK_RECORDS):
                on_chunk(out[handed:])
                handed = len(out)
            if self._pending:
                msgs, self._pending = self._pending, []
            else:
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0 or not self._assigned or self.interrupt.is_set():
                    break
                full = min_fill is not None and bool(out) and (len(out) >= min_fill[0] or nbytes >= min_fill[1])
                if (early is not None or full) and self.caught_up():
                    if polled and (full or (early is not None and now >= early)):
                        break  # everything available is read: commit it now
                    # (At least one fetch first: "caught up" dates from the last poll, records may have come since.)
                    if early is not None:
                        remaining = min(remaining, max(early - now, 0.01))
                # Short slices, so a stop or a new assignment ends the flush within ~0.1 s.
                want = FIRST_CHUNK_RECORDS if first and on_chunk is not None else self.fetch_batch
                msgs = self.consumer.consume(num_messages=min(want, max_records - len(out)),
                                             timeout=min(remaining, 0.1))
                polled = True
                if msgs and self.first_record_at is None:
                    self.first_record_at = time.monotonic()
                elif not msgs:
                    self._raise_refusals()
            if last:
                # The last batch goes as this one comes, as many records freed as are about to be made:
                # the freed memory is reused at once. Freed all at once (at the end of its cycle), a
                # batch empties whole arenas, which the allocator hands back to the kernel, and the next
                # batch faults fresh pages in again: 324k page faults per 1M records against 210k, 2.4
                # against 2.1 s of CPU for the bare consume-and-decode loop.
                del last[max(0, len(last) - len(msgs)):]
            if rows is not None:
                row = rows()
            fast = fill if row is not None else None
            i, n = 0, len(msgs)
            while i < n:
                if fast is not None:  # the records the row decoder takes, built in C; the first it does not take below
                    i, nbytes, full = fast(msgs, i, row, out, row_class, _SLOTS, at_end, max_records, max_bytes, nbytes)
                    if full:
                        self._pending = msgs[i:]
                        break
                    if i >= n:
                        break
                m = msgs[i]
                i += 1
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add((m.topic(), m.partition()))
                        continue
                    self._pending = []
                    raise self._error(m, err)
                if at_end:
                    at_end.discard((m.topic(), m.partition()))
                raw = m.value()
                whole = None  # an envelope decoded whole: its value has no bytes of its own
                checked = True  # False: a payload sliced by a known schema prefix (EnvelopeCutter), not checked yet
                if unwrap is not None and raw is not None:
                    payload, checked = unwrap(raw)
                    raw, whole = (payload, None) if payload is not None else (None, raw)
                key = m.key()
                what = "value"
                typed = False
                try:
                    try:
                        if whole is not None:
                            value = unwrap_whole(whole)
                        elif row is not None:
                            try:
                                value = row(raw)
                                typed = True
                            except (ValueError, TypeError):  # not exactly the row: the converter decides, as without it
                                value = decode(raw)
                        else:
                            value = decode(raw)
                    except (ValueError, RecursionError):
                        if checked:
                            raise
                        # A slice its decoder refuses: the whole envelope decides (the value, or the refusal).
                        raw, typed = None, False
                        value = unwrap_whole(m.value())
                    if decode_key is not None:
                        what = "key"
                        key = decode_key(key)
                except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
                    error = RecordError(
                        f"{what} cannot be decoded as {self.converter if what == 'value' else self.key_converter}: {exc}",
                        topic=m.topic(), partition=m.partition(), offset=m.offset(), component="converter",
                    )
                    if self.tolerate:
                        headers = m.headers()
                        batch.failed.append(FailedRecord(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                                         tuple(headers) if headers else (), m.timestamp()[1], error))
                        if len(batch.failed) >= MAX_FAILED_PER_BATCH:
                            self._pending = msgs[i:]
                            break  # the dead-letter manifest of one cycle stays small
                        continue
                    self._pending = []
                    batch.error = error
                    break
                if typed:  # the value slot holds the row, the headers slot the message (RowRecord converts them if read)
                    rec = SinkRecord(m.topic(), m.partition(), m.offset(), key, value, raw, m, m.timestamp()[1])
                    rec.__class__ = row_class
                    if registry is not None:
                        rec.value_schema = registry.schema
                else:
                    headers = m.headers()
                    rec = SinkRecord(m.topic(), m.partition(), m.offset(), key, value, raw if keep_raw else None,
                                     tuple(headers) if headers else (), m.timestamp()[1])
                    if registry is not None:
                        rec.value_schema = registry.schema
                    if value is UNDECODED:
                        # (Headers converted: the filesystem sink reads every record's, and a property
                        # reading them costs the envelope more than the conversion saves.)
                        rec.__class__ = LazyJsonRecord
                append(rec)
                if raw is not None:
                    nbytes += len(raw)
                if len(out) >= max_records or nbytes >= max_bytes:
                    self._pending = msgs[i:]
                    break
            if batch.error is not None:
                break  # everything before the bad record is delivered; nothing at or after it is
        if on_chunk is not None and len(out) > handed:
            on_chunk(out[handed:])
        batch.nbytes = nbytes
        last.clear()  # what this poll did not replace (a smaller batch) goes now
        self._last = out.copy()
        return batch

    def commit_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KTP

        try:
            self.consumer.commit(offsets=[KTP(tp.topic, tp.partition, off) for tp, off in offsets.items()], asynchronous=True)
        except KafkaException:
            pass  # best effort: the decision log, not the group, is the source of truth

    def close(self) -> None:
        self._last = []
        try:
            self.consumer.close()
        except RuntimeError:
            pass
