"""The produce loops of one partition's transaction: every row of an Arrow batch, one record per row.

Two loops send the same bytes: the C loop (:mod:`eosink.spark_jobs.native`) for the common case
(:func:`plain_outbox`), and the Python loop for everything else (several outboxes, ``when=``
filters, extra headers) or where the C loop is not available. They are a mixin of
:class:`eosink.spark_jobs.task.PartitionPublisher`, which owns the producer and the transaction;
this module is only the per-row work, the publisher's largest cost.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from confluent_kafka import KafkaException, Producer

from eosink.connectors.api.records import ID_HEADER, RUN_HEADER
from eosink.spark_jobs import native as native_produce

if TYPE_CHECKING:
    from eosink.spark_jobs.task import TaskSpec

#: Record headers as confluent-kafka takes them.
Headers = list[tuple[str, str | bytes | None]]

#: ``produce``'s positional arguments are (topic, value, key, partition, on_delivery, callback, timestamp,
#: headers); -1 is librdkafka's "let the partitioner choose" (what omitting ``partition`` means) and a
#: timestamp of 0 means "now".
_ANY_PARTITION = -1


def plain_outbox(spec: TaskSpec) -> bool:
    """The common case the C loop takes: one topic, every row, only the two eosink headers."""
    return len(spec.outboxes) == 1 and not spec.extra_headers and spec.outboxes[0].when_col is None and not spec.outboxes[0].headers


class ProduceLoops:
    """The produce loops, over the state :class:`~eosink.spark_jobs.task.PartitionPublisher` keeps."""

    spec: TaskSpec
    seq: int
    c_rows: int
    counts: dict[str, int]
    _producer: Producer | None
    _native: native_produce.NativeLoop | None
    _prefix: str
    _run: bytes

    def _fail(self, e: KafkaException, during: str) -> Exception:
        raise NotImplementedError

    def _check_budget(self) -> None:
        raise NotImplementedError

    def _produce(self, batch: pa.RecordBatch) -> None:
        """Every row of ``batch`` into the open transaction: one ``produce()`` call per record.

        This loop is the publisher's per-record Python cost, so it is kept to the minimum the
        client allows: keys and values arrive as ``bytes`` (the projection casts keys to binary
        in the JVM, so nothing is decoded here and re-encoded by the client), ``produce`` takes
        positional arguments (parsing keywords costs ~0.15 us a call), and the only objects built
        per row are the header list, the ``eosink.id`` tuple and its string. confluent-kafka has no
        batch call that takes headers (``produce_batch`` refuses them), and it copies the headers
        of every call into librdkafka, so the list cannot be shared between rows. The cyclic
        garbage collector is paused for the loop: those containers die at once and never form
        cycles, yet they would trigger a collection every few hundred rows (~4% of the task's CPU
        in a profile), each walking every young object of the worker.
        """
        if self._native is not None and self._produce_natively(batch):
            return
        producer = self._producer
        assert producer is not None
        produce = producer.produce
        prefix, run, extra = self._prefix, self._run, self.spec.extra_headers
        run_header = (RUN_HEADER, run)
        seq = self.seq
        cols = batch.columns
        plan = []
        for ob in self.spec.outboxes:
            whens = cols[ob.when_col].to_pylist() if ob.when_col is not None else None
            plan.append(
                (ob.topic, cols[ob.key_col].to_pylist(), cols[ob.value_col].to_pylist(), whens, extra + ob.headers)
            )
        collecting = gc.isenabled()
        gc.disable()
        try:
            if len(plan) == 1 and plan[0][3] is None and not plan[0][4]:
                # The common case, kept tight: one topic, every row, only the two eosink headers.
                topic, keys, values, _, _ = plan[0]
                for key, value in zip(keys, values):
                    hdrs: Headers = [(ID_HEADER, prefix + str(seq)), run_header]
                    try:
                        produce(topic, value, key, _ANY_PARTITION, None, None, 0, hdrs)
                    except BufferError:
                        self._produce_when_room(topic, value, key, hdrs)
                    seq += 1
                self.counts[topic] += len(keys)
            else:
                for i in range(batch.num_rows):
                    for topic, keys, values, whens, more in plan:
                        if whens is not None and not whens[i]:
                            continue
                        hdrs = [(ID_HEADER, prefix + str(seq)), run_header, *more]
                        try:
                            produce(topic, values[i], keys[i], _ANY_PARTITION, None, None, 0, hdrs)
                        except BufferError:
                            self._produce_when_room(topic, values[i], keys[i], hdrs)
                        seq += 1
                        self.counts[topic] += 1
        except KafkaException as e:
            raise self._fail(e, "produce") from None
        finally:
            self.seq = seq
            if collecting:
                gc.enable()
        producer.poll(0)

    def _produce_natively(self, batch: pa.RecordBatch) -> bool:
        """The common case (:func:`_plain_outbox`) in the C loop (:mod:`eosink.spark_jobs.native`);
        False, having produced nothing, for columns it does not read."""
        native = self._native
        assert native is not None and self._producer is not None
        ob = self.spec.outboxes[0]
        keys, values = batch.column(ob.key_col), batch.column(ob.value_col)
        if not native.fits(keys, values):
            return False
        producer, first, n, seq = self._producer, 0, batch.num_rows, self.seq
        prefix = self._prefix.encode()
        try:
            while first < n:
                done, err = native.produce(ob.topic, keys, values, first, ID_HEADER, prefix, seq + first, RUN_HEADER, self._run)
                first = done
                if err == native_produce.QUEUE_FULL:
                    producer.poll(0.05)  # librdkafka's queue is full: let it send, as the Python loop does
                    self._check_budget()
                elif err:
                    # Any other refusal: the same row through the client, which raises it as its own error
                    # (a fenced or failed producer) - or takes it, if the condition has passed.
                    k, v = keys[first].as_py(), values[first].as_py()
                    self._produce_when_room(ob.topic, v, k, [(ID_HEADER, self._prefix + str(seq + first)), (RUN_HEADER, self._run)])
                    first += 1
        except KafkaException as e:
            raise self._fail(e, "produce") from None
        finally:
            self.seq = seq + first
        self.counts[ob.topic] += n
        self.c_rows += n
        producer.poll(0)
        return True

    def _produce_when_room(self, topic: str, value: Any, key: Any, hdrs: Headers) -> None:
        """The local queue is full: wait for deliveries, serving the client's callbacks, until there is room
        (back-pressure; with reports only for failures, delivered records free their room themselves)."""
        assert self._producer is not None
        while True:
            self._producer.poll(0.05)
            self._check_budget()
            try:
                self._producer.produce(topic, value, key, headers=hdrs)
                return
            except BufferError:
                continue
