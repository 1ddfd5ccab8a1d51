"""JSON Lines bodies, one line per record, for every sink that writes them (filesystem, S3).

A record's JSON is written as the bytes it had on the topic when it is an object or array (no
decode and re-encode: most of a sink's CPU time otherwise), and as compact JSON otherwise.
Those bytes may hold line breaks - a producer that pretty-prints - and a line break inside a
record splits it over several lines that no JSON Lines reader can parse. Values holding a
newline byte are therefore re-encoded compactly; every other value stays a copy. The check is
a memchr over the values joined (``values``) or one ``in`` per record inside a loop that runs
anyway (``envelopes``): the common case pays almost nothing.

``values`` of records read undecoded (:class:`LazyJsonRecord`, the topic's bytes: what a sink that
only copies the values gets) is joined in C where the extension is built
(:mod:`.batches_native`): one pass over the records, then the copy and the line-break search with
the GIL released, so the request threads of an S3 prepare run meanwhile. Any other batch, or one
with a line break, takes the Python path below (as does every batch with :data:`native` set None).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii

from eosink.connectors.api.records import LazyJsonRecord, SinkRecord, json_document, key_json, values_of_types
from eosink.connectors.common import batches_native, jsoncodec

#: The C join (see the module doc), or None where it is not built or not enabled (tests set it).
native = batches_native.join
#: The slot the C join reads (``SinkRecord`` is a dataclass with slots: a member descriptor).
_RAW_SLOT = SinkRecord.__dict__["raw_value"]

_raw_value = operator.attrgetter("raw_value")
_CONTAINERS = (dict, list)
_JSON_CONTAINERS = frozenset(_CONTAINERS)
NEEDS_JSON = "JSON Lines output needs json or string values"


_OPEN = (b"{", b"[")


def line_digest(doc: bytes) -> int:
    """A digest of a JSON document that is the same for a record's value and the line a JSON Lines
    sink wrote for it: the bytes' own hash when they are an object or array on one line (written as
    they came), else the hash of their compact JSON (re-encoded by the writer). Only comparable
    within one process (``hash``)."""
    if doc[:1] in _OPEN and 10 not in doc:
        return hash(doc)
    try:
        return hash(jsoncodec.encode(json.loads(doc)))
    except (ValueError, RecursionError):
        return hash(doc)


def one_line(doc: bytes) -> bytes:
    """``doc`` as a single line: compact JSON when it holds a line break, else itself."""
    if b"\n" not in doc:
        return doc
    return json.dumps(json.loads(doc), separators=(",", ":"), ensure_ascii=False).encode()


def lines(records: Sequence[SinkRecord], component: str) -> list[bytes]:
    """Each record's value JSON as one line, without its newline: what :func:`values` joins, for a
    sink that gathers a body from several slices of a batch and joins it once."""
    # The usual batch - JSON objects or arrays, each with its bytes from the topic - is checked and
    # gathered by C loops (map/all), not a Python step per record.
    out = list(map(_raw_value, records))
    if None in out or not values_of_types(records, _JSON_CONTAINERS):
        out = [json_document(r, component=component, needs=NEEDS_JSON) for r in records]
    if b"\n" in b"".join(out):  # pretty-printed JSON on the topic: keep one record per line (a join
        out = list(map(one_line, out))  # and a memchr cost a fifth of counting the newlines)
    return out


def values(records: Sequence[SinkRecord], component: str) -> bytes:
    """Each record's value JSON, newline-terminated: the body S3 writes for ``format=jsonl``."""
    if native is not None and records:
        body = native([records if isinstance(records, list) else list(records)], LazyJsonRecord, _RAW_SLOT)
        if body is not None:
            return body
    out = lines(records, component)
    out.append(b"")  # the last line's newline, without copying the whole body once more
    return b"\n".join(out)


def envelopes(records: Sequence[SinkRecord], component: str) -> bytes:
    """One ``{"topic","partition","offset","key","id","value"}`` object per record and line: the
    filesystem sink's ``jsonl`` format, readable by ``jq`` without knowing the topic's schema."""
    # ``json.dumps(a_str)`` is exactly ``encode_basestring_ascii(a_str)`` (its default
    # ensure_ascii path): calling the C escaper directly skips the encoder's Python frames.
    esc = encode_basestring_ascii
    line = b'{"topic":%s,"partition":%d,"offset":%d,"key":%s,"id":%s,"value":%s}\n'
    # Without headers the id is "topic/partition/offset": '/' and digits need no escaping,
    # so its JSON is the escaped topic between the same quotes.
    line_tpo = b'{"topic":%s,"partition":%d,"offset":%d,"key":%s,"id":"%s/%d/%d","value":%s}\n'
    topics: dict[str, tuple[bytes, bytes]] = {}
    out: list[bytes] = []
    append = out.append
    # ``10 in raw`` (an int: one memchr) is seven times quicker than ``b"\n" in raw`` on short values.
    containers, nl, lazy = _CONTAINERS, ord("\n"), LazyJsonRecord
    for r in records:
        t = topics.get(r.topic)
        if t is None:
            quoted = esc(r.topic).encode()
            t = topics[r.topic] = (quoted, quoted[1:-1])
        k = r.key
        key = b"null" if k is None else esc(k.decode("utf-8", "replace")).encode() if k.__class__ is bytes else key_json(r)
        value = r.raw_value
        if not (value and (r.__class__ is lazy or isinstance(r.value, containers))):  # compact JSON never
            # holds a raw line break
            value = json_document(r, component=component, needs=NEEDS_JSON)
        elif nl in value:
            value = one_line(value)
        headers = r.headers  # (read once: a deferred record's are converted by a call)
        if headers:
            append(line % (t[0], r.partition, r.offset, key, esc(r.id_with(headers)).encode(), value))
        else:
            p, o = r.partition, r.offset
            append(line_tpo % (t[0], p, o, key, t[1], p, o, value))
    return b"".join(out)
