"""The worker's Avro row decoder in C (``_avro_rows.c``): one writer's schema's values into native row tuples.

Why: the decoder :mod:`eosink.worker.engine.avro_rows` generates is straight-line Python, a statement
per field's byte run, against JSON values parsed by msgspec in C; in C the same reads cost a fraction,
and building a datetime no longer goes through a timedelta and an addition. Its ``Program`` is the
compiled form of that generated decoder: per field its kind, whether it is a union with null (and the
null branch's index), and a decimal's context and scale; ``program(raw)`` gives the very tuple the
Python decoder gives (same types, same values) and raises ``ValueError`` wherever it raises one, and
``program.many(values, start)`` decodes a run of values of its header in one call, stopping at the
first it refuses. ``Rows`` is the per-record decoder of :class:`~eosink.worker.engine.avro_rows.AvroRows`:
the writer's schema looked up by the value's header (the last one remembered) and handed on, then the
value decoded, with no Python frame in between (the Python closure cost ~0.3 us a record, as much as
decoding the benchmark's record).

Where it is not built (no C compiler at install) or ``EOSINK_AVRO_NATIVE=0`` (or :data:`enabled` set
False, as tests do), :func:`program` returns None and the Python decoder runs as before.

``_records.c`` is the source's per-record loop for values the only sink's row decoder takes
(:meth:`eosink.worker.engine.source.KafkaSource.poll_batch`): the same records, built without a Python
frame per message (the loop's bytecode and the dataclass ``__init__`` cost ~1 us a record, as much as
everything else the worker does for it). :func:`filler` is None where it is not built or
``EOSINK_SOURCE_NATIVE=0`` (or :data:`records_enabled` set False).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

try:
    from eosink.worker.native import _avro_rows  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the generated Python decoder
    _avro_rows = None
try:
    from eosink.worker.native import _records  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the Python loop
    _records = None

ENV = "EOSINK_AVRO_NATIVE"
#: Field kinds, as ``_avro_rows.c`` numbers them.
KINDS = {"long": 0, "int": 0, "boolean": 1, "double": 2, "string": 3, "bytes": 4, "bytes/decimal": 5,
         "long/timestamp-millis": 6, "long/timestamp-micros": 7}
#: Whether :func:`program` builds C decoders (read once from the environment; tests set it).
enabled: bool = _avro_rows is not None and os.environ.get(ENV, "1") != "0"


RECORDS_ENV = "EOSINK_SOURCE_NATIVE"
#: Whether :func:`filler` gives the C loop (read once from the environment; tests set it).
records_enabled: bool = _records is not None and os.environ.get(RECORDS_ENV, "1") != "0"


def filler() -> Callable[..., tuple[int, int, bool]] | None:
    """``_records.fill`` (see ``_records.c``), or None where it is not built or not enabled."""
    return _records.fill if records_enabled and _records is not None else None


def available() -> bool:
    """Whether the extension is built and enabled."""
    return enabled and _avro_rows is not None


def program(header: bytes, fields: Sequence[tuple[int, int, Any, Any]]) -> Any | None:
    """The C decoder of values with ``header`` (5 bytes) whose fields are ``(kind, null branch index or -1,
    decimal context or None, -scale or None)``, or None where the extension is not available."""
    if not available():
        return None
    return _avro_rows.Program(header, tuple(fields))


def rows(by_header: dict[bytes, tuple[Any, Any]], registry: Any, build: Callable[[bytes], tuple[Any, Any]]) -> Any | None:
    """The C form of :meth:`AvroRows.__call__`'s decoder over ``by_header`` (header -> (decode, writer),
    filled by ``build(raw)``), setting ``registry.schema``; None where the extension is not available."""
    if not available():
        return None
    return _avro_rows.Rows(by_header, registry, build)
