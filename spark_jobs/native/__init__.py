"""The publisher's produce loop in C (``produce.c``): one ``rd_kafka_producev()`` per row, straight
from the Arrow buffers Spark hands over, in the producer confluent-kafka opened.

Why: per record, the Python loop turns the key and value into ``bytes`` objects, builds a header
list and makes one ``produce()`` call that parses its arguments and converts the headers: ~2 us of
the task's CPU, the publisher's largest cost (Spark's own Kafka sink spends less per record in the
JVM). The C loop reads each row's key and value where Arrow keeps them and formats the ``eosink.id``
header in a stack buffer: ~1 us per record, the GIL released.

How it gets at the producer: confluent-kafka keeps librdkafka's handle as the first field of its
``Producer`` object and registers that object as the handle's opaque; the address is taken only
when ``rd_kafka_opaque()`` of the handle found there gives the ``Producer`` back. librdkafka is the
very library confluent-kafka loaded (found in ``/proc/self/maps``), so both share one handle, one
transaction and one queue. Messages are produced with no per-message opaque, so confluent-kafka's
delivery callback has nothing to call for them (the publisher reads no delivery reports: a failed
delivery fails the transaction's commit).

Where any of that does not hold (no compiler when installed, another platform or client version,
``EOSINK_PUBLISHER_NATIVE=0``), :func:`loop_for` returns None and the Python loop runs as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

import pyarrow as pa

log = logging.getLogger(__name__)
#: librdkafka's RD_KAFKA_RESP_ERR__QUEUE_FULL: the loop stops, the caller serves the queue and resumes.
QUEUE_FULL = -184
ENV = "EOSINK_PUBLISHER_NATIVE"
_OFFSET_KINDS = {pa.binary(): False, pa.string(): False, pa.large_binary(): True, pa.large_string(): True}

try:
    from eosink.spark_jobs.native import _produce  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the Python loop
    _produce = None

_producev: int | None = None
_opaque: Any = None


def _library() -> bool:
    """librdkafka as confluent-kafka loaded it: rd_kafka_producev's address and rd_kafka_opaque."""
    global _producev, _opaque
    if _producev is not None:
        return True
    import confluent_kafka.cimpl  # noqa: F401 - loads librdkafka

    try:
        with open("/proc/self/maps") as maps:
            path = next(line.split()[-1] for line in maps if "librdkafka" in line and line.rstrip().endswith((".so", ".so.1")))
        lib = ctypes.CDLL(path)
    except (OSError, StopIteration):
        return False
    lib.rd_kafka_opaque.restype = ctypes.c_void_p
    lib.rd_kafka_opaque.argtypes = [ctypes.c_void_p]
    _opaque = lib.rd_kafka_opaque
    _producev = ctypes.cast(lib.rd_kafka_producev, ctypes.c_void_p).value
    return True


class NativeLoop:
    """The C produce loop bound to one confluent-kafka ``Producer``."""

    def __init__(self, producer: Any, handle: int) -> None:
        self.producer = producer  # keeps the handle alive as long as the loop
        self.handle = handle

    @staticmethod
    def fits(keys: pa.Array, values: pa.Array) -> bool:
        """Whether both columns are (large) binary or string, as the loop reads them."""
        return keys.type in _OFFSET_KINDS and values.type in _OFFSET_KINDS

    def produce(self, topic: str, keys: pa.Array, values: pa.Array, first: int, id_name: str, id_prefix: bytes, seq: int,
                run_name: str, run: bytes) -> tuple[int, int]:
        """Rows ``first`` .. of the two columns, record ids ``id_prefix + str(seq + i - first)``.

        Returns ``(next row, librdkafka error)``: ``(len, 0)`` when every row went into the queue;
        otherwise the row that was refused and why (the caller serves a full queue and resumes, and
        produces that row through the client for any other error, which raises it as the client does).
        """
        kb, vb = keys.buffers(), values.buffers()
        assert _produce is not None and _producev is not None
        result: tuple[int, int] = _produce.produce(
            _producev, self.handle, topic, len(values), first,
            kb[0], kb[1], kb[2], keys.offset, _OFFSET_KINDS[keys.type],
            vb[0], vb[1], vb[2], values.offset, _OFFSET_KINDS[values.type],
            id_name, id_prefix, seq, run_name, run,
        )
        return result


def loop_for(producer: Any) -> NativeLoop | None:
    """The C loop for ``producer``, or None where it cannot be used (see the module docs)."""
    from confluent_kafka import Producer

    if _produce is None or os.environ.get(ENV, "1") == "0" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    if not isinstance(producer, Producer):  # only a confluent-kafka Producer has the layout read below
        return None
    if not _library():
        log.info("librdkafka not found among the loaded libraries: the publisher produces from Python")
        return None
    # PyObject_HEAD (refcount, type) is 16 bytes; confluent-kafka's Handle has rd_kafka_t *rk next.
    handle = ctypes.c_void_p.from_address(id(producer) + 16).value
    if not handle or _opaque(handle) != id(producer):
        log.info("confluent-kafka's producer handle is not where this loop expects it: the publisher produces from Python")
        return None
    return NativeLoop(producer, handle)
