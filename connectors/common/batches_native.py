"""A batching sink's per-record loops in C (``_batches.c``): grouping records per partition, joining JSON Lines.

Why: a cycle of 50,000 records through the S3 sink spent ~3 ms grouping them in ``write`` and ~10 ms
joining the JSON Lines bodies in ``pre_commit``, Python steps per record under the GIL beside the
request threads. :func:`group` is :func:`eosink.connectors.s3.staging.group`'s loop, :func:`join`
:func:`eosink.connectors.common.jsonlines.values`'s for undecoded records (the copy with the GIL
released); both answer None for anything outside the plain case, and the caller's Python path then
runs as before, with the same results and errors.

Where the extension is not built (no C compiler at install) or ``EOSINK_BATCHES_NATIVE=0``, both are
None and the Python paths run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

try:
    from eosink.connectors.common import _batches  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the Python paths
    _batches = None

ENV = "EOSINK_BATCHES_NATIVE"
_enabled = _batches is not None and os.environ.get(ENV, "1") != "0"
#: ``group(records, topic_slot, partition_slot) -> {partition: [records]} | None`` (see ``_batches.c``).
group: Callable[[list[Any], Any, Any], dict[int, list[Any]] | None] | None = _batches.group if _enabled else None
#: ``join(slices, cls, raw_slot) -> bytes | None`` (see ``_batches.c``).
join: Callable[[list[list[Any]], type, Any], bytes | None] | None = _batches.join if _enabled else None
