"""JSON at native speed with the standard library's exact results: msgspec where it agrees, the stdlib elsewhere.

Decoding a ~200-byte record value is most of what ``value.converter=json`` costs: ``json.loads`` takes
~6.7 us here, msgspec's decoder ~0.9 us. The contract stays the standard library's - :func:`decode` returns
what ``json.loads(raw)`` returns and refuses what it refuses, with its exception - because the values
reach sinks, dead-letter records and tests that were written against ``json.loads``. msgspec agrees with it
on every valid RFC 8259 document (integers beyond 64 bits stay exact ints, duplicate keys keep the last
value at the first key's position, floats round the same way); where it does not, it refuses, and the
document is then handed to ``json.loads``, whose answer (a value or an exception) is the result:

* ``NaN``, ``Infinity``, ``-Infinity``: ``json.loads`` accepts them (and so did the worker's converter
  before this module: its behaviour is the spec), msgspec refuses - they decode to the float values.
* numbers beyond the float range (``1e400``): ``json.loads`` gives ``inf``, msgspec refuses.
* lone UTF-16 surrogates, escaped (``"\\ud800"``) or as bytes (``ED A0 80``: ``json.loads`` decodes
  bytes with ``surrogatepass``): ``json.loads`` keeps them in the string, msgspec refuses.
* a UTF-8 byte order mark, UTF-16/UTF-32 input (``json.detect_encoding``): ``json.loads`` decodes them,
  msgspec refuses.
* integers over ``sys.get_int_max_str_digits()`` digits, invalid UTF-8, malformed documents: both refuse;
  the stdlib's exception (``JSONDecodeError``, ``UnicodeDecodeError``, ``ValueError``) is what is raised.
* nesting: both stop at the interpreter's recursion limit (``RecursionError``), but msgspec a few levels
  deeper than ``json.loads``. A document with at least ``sys.getrecursionlimit() - CALLER_FRAMES`` opening
  brackets (``[`` or ``{``, counted in strings too) is left to the stdlib, so only documents that cannot come near the
  limit go native - exact as long as the caller's stack is under ~190 frames deep (the worker's poll is
  a few dozen).
* anything but ``bytes`` (``str``, ``bytearray``): straight to ``json.loads``.

:func:`encode` is ``json.dumps(value, separators=(",", ":")).encode()`` - compact, ASCII-only
(``ensure_ascii``), ``NaN``/``Infinity`` allowed - the form the sinks write for values that have no bytes
of their own (``eosink.connectors.api.records.json_document``). msgspec writes the same bytes for plain
documents: exact ``dict`` (``str`` keys), ``list``, ``tuple``, ``str``, ``int``, ``bool``, ``None`` and finite
floats in ``[1e-4, 1e16)`` (where ``repr`` uses no exponent), provided the output is ASCII without DEL
(``ensure_ascii`` escapes the rest). Anything else - exponents (``1e+16`` against msgspec's ``1e16``), NaN
(msgspec writes ``null``), subclasses (``IntEnum``), bytes or sets (msgspec encodes them, ``json.dumps``
refuses), non-string keys, cycles, deep nesting - goes to the stdlib encoder.

:func:`encode_json_value` is the cheaper promise a transformed record needs: bytes that ``json.loads``
reads back as the value, for a value known to hold JSON types only (what :func:`decode` returns; the
transform chain knows when its output still does). It skips :func:`encode`'s walk over the value (half
of its cost: a Python step per field) because what that walk guards against cannot occur there - or is
visible in the output: msgspec writes NaN and Infinity as ``null``, so only a document holding ``null``
is searched for them. Its bytes may differ from ``json.dumps``' where both read back the same: floats
with an exponent (``1e16``, not ``1e+16``), non-ASCII text as UTF-8 rather than ``\\u`` escapes (as a
producer's own bytes may hold it).

:func:`is_json_container` answers, without decoding, what a sink that copies a record's bytes needs to
know: would :func:`decode` accept them, as an object or an array? msgspec's parser into ``msgspec.Raw``
walks the whole document without building a value (~0.13 against ~0.4 us for a ~200-byte record, and
nothing to free), but it is more lenient than :func:`decode` in three ways, each checked before it
runs: it does not check that strings are UTF-8 (``json.loads`` refuses invalid UTF-8), it takes integers
of any length (``json.loads`` refuses more than ``sys.get_int_max_str_digits()`` digits), and it nests
deeper. A document outside those checks gets False, which only means "decode it to know".
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from typing import Any

import msgspec

__all__ = ["decode", "decode_value", "encode", "encode_json_value", "envelope_payload", "EnvelopeCutter", "is_json_container"]

_native_decode = msgspec.json.Decoder().decode
_native_encode = msgspec.json.Encoder().encode
_loads = json.loads
_dumps = json.JSONEncoder(separators=(",", ":")).encode  # what json.dumps(v, separators=(",", ":")) calls
_getrecursionlimit = sys.getrecursionlimit
_get_int_max_str_digits = sys.get_int_max_str_digits
_native_skip = msgspec.json.Decoder(type=msgspec.Raw).decode  # parses, builds nothing
_OPENERS = (b"{", b"[")
_isfinite = math.isfinite

#: Frames the callers may already use below a decode: the margin kept from the recursion limit.
CALLER_FRAMES = 200
#: Encoding goes native only for documents nested less deeply than this.
ENCODE_MAX_DEPTH = 256
_PLAIN_FLOAT_MIN, _PLAIN_FLOAT_MAX = 1e-4, 1e16  # repr() writes no exponent in between (nor does msgspec)


def decode(raw: bytes) -> Any:
    """``json.loads(raw)``: the same value, or the same exception (see the module's docstring)."""
    if raw is None:
        return _loads(raw)  # json.loads' TypeError, where decode_value sees a tombstone
    return decode_value(raw)


def decode_value(raw: bytes | None) -> Any:
    """A record value as ``value.converter=json`` decodes it: :func:`decode`, and ``None`` (a tombstone) as ``None``."""
    if raw.__class__ is bytes:
        # Fewer opening brackets than this cannot nest near the recursion limit (see the module's docstring).
        bound = _getrecursionlimit() - CALLER_FRAMES
        if len(raw) < bound or raw.count(b"[") + raw.count(b"{") < bound:
            try:
                return _native_decode(raw)
            except (ValueError, RecursionError):  # msgspec.DecodeError and UnicodeDecodeError are ValueErrors
                pass  # refused natively: the stdlib decides (the module's docstring lists where they differ)
    elif raw is None:
        return None
    return _loads(raw)


def is_json_container(raw: bytes) -> bool:
    """True when :func:`decode` would accept ``raw`` (``bytes``) and give a dict or a list; False when
    it would not, or when that cannot be told without decoding (see the module's docstring)."""
    if raw[:1] not in _OPENERS or not _parse_agrees(raw):  # a leading space, a BOM, a scalar: rare, decoded
        return False
    try:
        _native_skip(raw)
    except (ValueError, RecursionError):
        return False
    return True


class _Envelope(msgspec.Struct):
    """Kafka Connect's JSON with ``schemas.enable=true``; the parts kept as their bytes."""

    schema: msgspec.Raw
    payload: msgspec.Raw


_native_envelope = msgspec.json.Decoder(type=_Envelope).decode


def envelope_payload(raw: bytes) -> bytes | None:
    """The bytes of the ``payload`` of Kafka Connect's ``{"schema": ..., "payload": ...}`` envelope in
    ``raw``, without decoding the schema or the payload: ~1 us for the 750-byte envelope of a 200-byte
    record, where decoding it whole takes ~3 us. ``None`` when :func:`decode` would refuse ``raw``, would
    not give an object holding both keys, or when that cannot be told natively (as for
    :func:`is_json_container`), and for a null payload: the caller then decodes the whole document.
    Duplicate keys keep the last value, as ``json.loads`` does."""
    if (raw[:1] != b"{" and raw.lstrip(b" \t\r\n")[:1] != b"{") or not _parse_agrees(raw):
        return None
    try:
        payload = bytes(_native_envelope(raw).payload)
    except (ValueError, RecursionError):  # msgspec.ValidationError too: a key missing, not an object
        return None
    return None if payload == b"null" else payload


class EnvelopeCutter:
    """:func:`envelope_payload` at the cost of a comparison, for a topic whose envelopes repeat a schema.

    Every record of a producer's topic carries the same schema, usually larger than the payload: once
    an envelope was cut (checked whole by :func:`envelope_payload`) and ended ``"payload":<payload>}``,
    its bytes before the payload are kept, and a later envelope that starts with the same bytes and
    ends with ``}`` is cut by slicing. Whatever a value slot holds, those bytes around it make an
    envelope whose payload (the last ``payload`` key's value) is that value - provided it is one JSON
    value, which the slice's decoder checks: **a slice the decoder refuses must be decided by
    :func:`envelope_payload` or by decoding the whole envelope**, never reported as it is (it may be
    ``{..},"payload":{..}``, an envelope with a later ``payload`` key). At most :data:`PREFIXES` schemas
    are kept, the latest learnt replacing the oldest. One instance per reader (not thread-safe).
    """

    PREFIXES = 8

    def __init__(self) -> None:
        self._prefixes: list[bytes] = []

    def __call__(self, raw: bytes) -> tuple[bytes | None, bool]:
        """``(payload, checked)``: the payload's bytes (None: decode ``raw`` whole), and whether ``raw``
        was checked whole (False: cut by a known prefix, the slice not checked yet)."""
        if raw[-1:] == b"}":
            for prefix in self._prefixes:
                if raw.startswith(prefix):
                    payload = raw[len(prefix):-1]
                    return (None, True) if payload == b"null" else (payload, False)
        cut = envelope_payload(raw)
        if cut is not None:
            self._learn(raw, cut)
        return cut, True

    def _learn(self, raw: bytes, payload: bytes) -> None:
        n = len(raw) - 1 - len(payload)
        if raw[-1:] == b"}" and raw[n:-1] == payload and raw[:n].endswith(b'"payload":'):
            self._prefixes.insert(0, raw[:n])
            del self._prefixes[self.PREFIXES:]


def _parse_agrees(raw: bytes) -> bool:
    """Whether msgspec's parse of ``raw`` into ``msgspec.Raw`` agrees with :func:`decode` on accepting it:
    False where it is more lenient (see the module's docstring)."""
    n = len(raw)
    bound = _getrecursionlimit() - CALLER_FRAMES
    if n >= bound and raw.count(b"[") + raw.count(b"{") >= bound:
        return False
    digits = _get_int_max_str_digits()
    if digits and n > digits and _digit_run(digits).search(raw) is not None:
        return False  # json.loads refuses an integer that long (and msgspec's parse would not)
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError:
            return False  # json.loads may still take it (a lone surrogate's bytes): decode decides
    return True


@functools.lru_cache(maxsize=4)
def _digit_run(digits: int) -> re.Pattern[bytes]:
    return re.compile(rb"[0-9]{%d}" % (digits + 1))


def encode(value: Any) -> bytes:
    """``json.dumps(value, separators=(",", ":")).encode()``: the same bytes, or the same exception."""
    try:
        if _plain(value, 0):
            out = _native_encode(value)
            if out.isascii() and b"\x7f" not in out:
                return out
    except (ValueError, RecursionError):
        pass  # a lone surrogate, an int over the digit limit, a cycle, deep nesting: json.dumps has the last word
    return _dumps(value).encode()


def encode_json_value(value: Any) -> bytes | None:
    """Compact JSON that ``json.loads`` reads back as ``value``, which must hold JSON types only (dict with
    str keys, list, str, int, float, bool, None); ``None`` where msgspec cannot give it (NaN, Infinity, a
    lone surrogate, deep nesting): the caller then encodes exactly (:func:`encode`)."""
    try:
        out = _native_encode(value)
    except (ValueError, TypeError, RecursionError):
        return None
    if out.rfind(b"null") >= 0 and not _finite(value):  # msgspec writes NaN and Infinity as null (rfind:
        # a third of ``in``'s time on short documents)
        return None
    return out


def _finite(value: Any) -> bool:
    """No NaN or infinite float anywhere in ``value`` (iterative: as deep as msgspec encodes)."""
    pending = [value]
    pop, extend = pending.pop, pending.extend
    while pending:
        x = pop()
        c = x.__class__
        if c is float:
            if not _isfinite(x):
                return False
        elif c is dict:
            extend(x.values())
        elif c is list or c is tuple:
            extend(x)
    return True


_SCALARS = frozenset((str, int, bool, type(None)))


def _plain(value: Any, depth: int) -> bool:
    """Whether msgspec writes ``value`` exactly as ``json.dumps`` does (but for non-ASCII output, checked after)."""
    cls = value.__class__
    if cls is dict:
        if depth >= ENCODE_MAX_DEPTH or not all(k.__class__ is str for k in value):
            return False
        items = value.values()
    elif cls is list or cls is tuple:
        if depth >= ENCODE_MAX_DEPTH:
            return False
        items = value
    elif cls in _SCALARS:
        return True
    elif cls is float:
        return _plain_float(value)
    else:
        return False
    depth += 1
    for x in items:
        c = x.__class__
        if c in _SCALARS:
            continue
        if c is float:
            if not _plain_float(x):
                return False
        elif not _plain(x, depth):
            return False
    return True


def _plain_float(x: float) -> bool:
    return x == 0.0 or _PLAIN_FLOAT_MIN <= abs(x) < _PLAIN_FLOAT_MAX  # NaN compares False: not plain
