"""Confluent's Schema Registry converters: Avro, Protobuf and JSON Schema in Confluent's wire format.

A value is ``0x00``, the writer's schema id (4 bytes, big-endian), then the payload (Protobuf puts
its message indexes first). The schema is fetched once per id (confluent-kafka's
``SchemaRegistryClient``, which caches it) and turned once into a decode function, kept by id:

* Avro: fastavro's ``schemaless_reader`` on the bytes after the header, with the parsed writer
  schema (~5x confluent-kafka's ``AvroDeserializer``). Records become dicts. The subjects a schema
  references are fetched with it (recursively) and parsed as named types before it.
* Protobuf: the message class built from the registered descriptor; the message becomes a dict by
  field name (every field, proto3 defaults too; int64 an int, enums by name).
* JSON Schema: the JSON after the header, validated against the registered schema.

Values reach sinks as JSON values, as ``value.converter=json`` would give them, so every sink takes
them as it takes JSON: where a schema has logical types or bytes, a ``decimal`` becomes its exact
decimal text, ``timestamp-*``, ``date`` and ``time-*`` their ISO 8601 text (timestamps with
``+00:00``), ``uuid`` its text, and ``bytes``/``fixed`` PostgreSQL's hex text (``\\x0a1b``): a
numeric, timestamptz, date, uuid or bytea column parses each exactly.

What a record's bytes get wrong - no magic byte, an id the registry does not know, a payload that
does not match its schema - raises :class:`ValueError` naming the schema id: the source turns it
into a record error (dead-letter topic under ``errors.tolerance=all``, else the task fails naming
topic, partition and offset). A registry that does not answer raises :class:`RetryableError` naming
its address: the cycle is aborted and read again once it answers.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import io
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from eosink.connectors.api.errors import FatalError, RetryableError
from eosink.connectors.api.schemas import WriterSchema
from eosink.connectors.common import jsoncodec

AVRO = "io.confluent.connect.avro.AvroConverter"
PROTOBUF = "io.confluent.connect.protobuf.ProtobufConverter"
JSON_SCHEMA = "io.confluent.connect.json.JsonSchemaConverter"
#: Converter class -> the short name eosink uses (``value.converter`` takes either).
FORMATS = {AVRO: "avro", PROTOBUF: "protobuf", JSON_SCHEMA: "jsonschema"}
#: The Connect converter keys under ``value.converter.`` / ``key.converter.`` that these converters read.
SETTINGS = ("schema.registry.url", "basic.auth.credentials.source", "basic.auth.user.info",
            "schema.registry.ssl.ca.location")

Decode = Callable[[bytes], Any]


def client_config(url: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """confluent-kafka's ``SchemaRegistryClient`` config from Connect's converter keys (without the prefix).

    ``basic.auth.credentials.source``: ``USER_INFO`` (``basic.auth.user.info`` = ``user:password``) or
    ``URL`` (credentials in the URL, ``http://user:password@host``, as confluent-kafka reads them).
    ``schema.registry.ssl.ca.location``: the PEM CA an https registry is verified against (its
    ``ssl.ca.location``); without it, the system's trust store. Verification is never switched off."""
    conf: dict[str, Any] = {"url": url}
    if settings.get("schema.registry.ssl.ca.location"):
        conf["ssl.ca.location"] = str(settings["schema.registry.ssl.ca.location"])
    source = str(settings.get("basic.auth.credentials.source") or "").upper()
    if source == "USER_INFO" and settings.get("basic.auth.user.info"):
        conf["basic.auth.user.info"] = str(settings["basic.auth.user.info"])
    return conf


def warm() -> None:
    """Import confluent-kafka's Schema Registry client (what :class:`RegistryDecoder` is built on) now.

    Its import pulls in httpx, authlib and joserfc: 0.2-0.5 s of CPU, which a worker would otherwise spend
    in the first cycle of its first connector with a registry converter, before its first record; the
    worker runs this in a thread of its own as it starts (a worker without such connectors pays the
    import once, ~20 MB)."""
    try:
        import confluent_kafka.schema_registry  # noqa: F401
    except ImportError:
        pass  # (RegistryDecoder names what is missing, when a converter needs it)


class RegistryDecoder:
    """The decode function of one converter (``avro``, ``protobuf``, ``jsonschema``) for keys or values."""

    def __init__(self, fmt: str, url: str, settings: Mapping[str, Any] | None = None, *, timeout_s: float = 10.0) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        if fmt not in FORMATS.values():
            raise KeyError(fmt)
        self.format = fmt
        self.url = url.rstrip("/")
        conf = client_config(self.url, settings or {})
        conf["timeout"] = timeout_s
        conf["max.retries"] = 0  # the cycle is retried with its own backoff (errors.retry.*)
        try:
            self.client = SchemaRegistryClient(conf)
        except ValueError as exc:  # e.g. credentials both in the URL and in basic.auth.user.info, or no ':' in them
            raise FatalError(f"the schema registry settings of the {fmt} converter are not usable: {exc}",
                             component="config") from None
        self._by_id: dict[int, tuple[Decode, WriterSchema]] = {}
        #: Avro: the writer's schema as fastavro parsed it, by id (what a native row decoder is built from).
        self._avro_parsed: dict[int, Any] = {}
        #: The writer's schema of the last value decoded (None after a tombstone): the source hands it on
        #: with the record (:attr:`~eosink.connectors.api.records.SinkRecord.value_schema`), one shared
        #: object per schema id.
        self.schema: WriterSchema | None = None

    def __call__(self, raw: bytes | None) -> Any:
        if raw is None:
            self.schema = None
            return None
        if len(raw) < 5 or raw[0] != 0:
            raise ValueError(f"not in Confluent's wire format: no magic byte 0 and 4-byte schema id "
                             f"(first bytes {bytes(raw[:5])!r}, {len(raw)} bytes)")
        schema_id = int.from_bytes(raw[1:5], "big")
        entry = self._by_id.get(schema_id)
        if entry is None:
            entry = self._by_id[schema_id] = self._load(schema_id)
        decode, self.schema = entry
        try:
            return decode(raw)
        except ValueError as exc:
            raise ValueError(f"payload does not match schema id {schema_id}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a decoder's refusal of bad bytes comes in many classes
            raise ValueError(f"payload does not match schema id {schema_id}: {type(exc).__name__}: {exc}") from None

    def avro_schema(self, schema_id: int) -> tuple[Any, WriterSchema]:
        """The fastavro-parsed Avro schema of ``schema_id`` and its :class:`WriterSchema` (fetched once, as for
        decoding); raises as :meth:`__call__` does for an unknown id or an unreachable registry."""
        entry = self._by_id.get(schema_id)
        if entry is None:
            entry = self._by_id[schema_id] = self._load(schema_id)
        return self._avro_parsed[schema_id], entry[1]

    def _versions(self, schema_id: int) -> list[tuple[str, int]]:
        return [(str(v.subject), int(v.version or 0)) for v in self.client.get_schema_versions(schema_id)]

    def _load(self, schema_id: int) -> tuple[Decode, WriterSchema]:
        schema, named = self._fetch(schema_id)
        kind = (schema.schema_type or "AVRO").upper()
        expected = {"avro": "AVRO", "protobuf": "PROTOBUF", "jsonschema": "JSON"}[self.format]
        if kind != expected:
            raise ValueError(f"schema id {schema_id} is a {kind} schema, not {expected} as the converter expects")
        writer = WriterSchema(schema_id, self.format, schema.schema_str or "", self.url, lambda: self._versions(schema_id),
                              lambda subject, version: int(self.client.get_version(subject, version).schema_id or 0))
        try:
            if self.format == "avro":
                decode, self._avro_parsed[schema_id] = _avro(schema, named)
                return decode, writer
            if self.format == "protobuf":
                pool, own = self._pool_of(schema_id, schema)
                decode, writer.parsed = _protobuf(pool, own)
                writer.descriptor = pool.FindFileByName(own.name)  # what a sink types nested messages from
                return decode, writer
            return _json_schema(schema), writer
        except RetryableError:
            raise  # the registry did not hand out what the schema imports: not the schema's fault
        except Exception as exc:  # noqa: BLE001 - whatever the parser refuses
            raise ValueError(f"schema id {schema_id} cannot be used: {type(exc).__name__}: {exc}") from None

    def _fetch(self, schema_id: int) -> tuple[Any, dict[str, Any]]:
        """The schema of ``schema_id`` and, for Avro, the subjects it references (schema references), fetched
        recursively as named types by name; a registry that does not answer is retryable, not a record error."""
        from confluent_kafka.schema_registry._sync.avro import _resolve_named_schema

        what = f"schema id {schema_id}"
        try:
            schema = self.client.get_schema(schema_id)
            if self.format != "avro" or not schema.references or (schema.schema_type or "AVRO").upper() != "AVRO":
                return schema, {}
            what = _referenced_by(schema_id, schema)
            return schema, _resolve_named_schema(schema, self.client)
        except Exception as exc:  # noqa: BLE001 - classified by _unavailable
            raise self._unavailable(exc, what) from None

    def _pool_of(self, schema_id: int, schema: Any) -> tuple[Any, Any]:
        """A Protobuf descriptor pool holding the well-known types and every file ``schema`` imports, and the
        schema's own ``FileDescriptorProto`` (added to it).

        Imports are fetched from the registry recursively, each under the name the importing file gives
        it. A file comes as the registry serves it: a base64 descriptor (Apicurio's default), else it is
        asked again in Confluent's ``format=serialized`` (Confluent's registry serves ``.proto`` text by
        default; Apicurio 3.3 answers 500 to that format for a referenced version). A registry that does
        not answer is retryable, not a schema that "cannot be used"."""
        from confluent_kafka.schema_registry.common.protobuf import _init_pool, _is_builtin
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from google.protobuf.descriptor_pool import DescriptorPool

        pool = DescriptorPool()
        _init_pool(pool)
        visited: set[str] = set()

        def add_imports(of: Any) -> None:
            for ref in of.references or ():
                if _is_builtin(ref.name) or ref.name in visited:
                    continue
                visited.add(ref.name)
                found = self.client.get_version(ref.subject, ref.version, True).schema
                add_imports(found)
                pool.Add(_descriptor(ref.name, found.schema_str, functools.partial(serialized, ref.subject, ref.version)))

        def serialized(subject: str, version: int) -> str | None:
            return self.client.get_version(subject, version, True, "serialized").schema.schema_str

        what = _referenced_by(schema_id, schema)
        try:
            add_imports(schema)
            what = f"schema id {schema_id}"
            own = _descriptor("default", schema.schema_str,
                              lambda: self.client.get_schema(schema_id, fmt="serialized").schema_str)
        except (SchemaRegistryError, OSError) as exc:
            raise self._unavailable(exc, what) from None
        except Exception as exc:  # noqa: BLE001 - the client's transport errors are not all OSErrors
            if type(exc).__module__.startswith(("httpx", "httpcore", "requests", "urllib3")):  # (httpx2: the client's)
                raise self._unavailable(exc, what) from None
            raise  # a file that does not parse: the caller's "cannot be used"
        pool.Add(own)
        return pool, own

    def _unavailable(self, exc: Exception, what: str) -> Exception:
        """The error for a registry request about ``what`` that failed: an unknown id is the record's (a
        ``ValueError``), anything else retryable, naming the registry."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if isinstance(exc, SchemaRegistryError):
            if exc.http_status_code == 404:
                return ValueError(f"{what} is unknown to the schema registry at {self.url} ({exc.error_message})")
            if exc.http_status_code in (401, 403):
                return RetryableError(f"the schema registry at {self.url} refused to hand out {what} "
                                      f"(HTTP {exc.http_status_code}: {exc.error_message}); check "
                                      "basic.auth.user.info", component="schema-registry")
            return RetryableError(f"the schema registry at {self.url} failed to hand out {what}: "
                                  f"HTTP {exc.http_status_code}: {exc.error_message}", component="schema-registry")
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            return RetryableError(f"the schema registry at {self.url} has a certificate this worker does not trust "
                                  f"({exc}); check schema.registry.ssl.ca.location", component="schema-registry")
        return RetryableError(f"the schema registry at {self.url} is not reachable ({type(exc).__name__}: {exc}); "
                              f"delivery resumes when it answers", component="schema-registry")


def _avro(schema: Any, references: Mapping[str, Any]) -> tuple[Decode, Any]:
    """The decoder of an Avro writer's schema, and the schema as fastavro parsed it; ``references``: the raw
    schemas it references, by name."""
    from confluent_kafka.schema_registry.common.avro import parse_schema_with_repo
    from fastavro import schemaless_reader

    # Referenced schemas are named types the root may use by name; fastavro inlines each at its first use.
    parsed: Any = parse_schema_with_repo(schema.schema_str, dict(references))
    texty = _text_names(parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {})
    # Only the fields whose type JSON lacks are rewritten (the whole value when it is no record):
    # walking every value measured ~2x the decode itself.
    fields = parsed.get("fields") if isinstance(parsed, dict) and parsed.get("type") == "record" else None
    whole = fields is None and _needs_text(parsed, texty)
    fix = [] if fields is None else [f["name"] for f in fields if _needs_text(f["type"], texty)]

    def decode(raw: bytes) -> Any:
        buf = io.BytesIO(raw)
        buf.seek(5)
        value: Any = schemaless_reader(buf, parsed, None)
        if buf.tell() != len(raw):
            raise ValueError(f"{len(raw) - buf.tell()} bytes left over after the record")
        if whole:
            return jsonable(value)
        for name in fix:
            v = value[name]
            if v is not None:
                value[name] = jsonable(v)
        return value

    return decode, parsed


def _text_names(named: Mapping[str, Any]) -> frozenset[str]:
    """Full names of the named types whose values may hold something JSON lacks, directly or through another
    named type (a field may name a type defined elsewhere: earlier in the schema, or in a referenced one)."""
    texts = {name: json.dumps(definition) for name, definition in named.items()}
    found = {name for name, text in texts.items() if _needs_text_words(text)}
    while more := {n for n, text in texts.items() if n not in found and any(f'"{m}"' in text for m in found)}:
        found |= more
    return frozenset(found)


def _needs_text(avro_type: Any, names: frozenset[str] = frozenset()) -> bool:
    """Whether values of this Avro type may hold something JSON has no type for (bytes, fixed, logical types),
    ``names`` being the named types that may (:func:`_text_names`)."""
    text = json.dumps(avro_type)
    return _needs_text_words(text) or any(f'"{name}"' in text for name in names)


def _needs_text_words(text: str) -> bool:
    return any(word in text for word in ('"bytes"', '"fixed"', '"logicalType"'))


def jsonable(value: Any) -> Any:
    """``value`` with what JSON has no type for as the text PostgreSQL parses exactly (see the module doc)."""
    t = type(value)
    if t is dict:
        return {k: jsonable(v) for k, v in value.items()}
    if t is list:
        return [jsonable(v) for v in value]
    if t in (str, int, float, bool) or value is None:
        return value
    if t is bytes:
        return "\\x" + value.hex()
    if t is decimal.Decimal:
        return format(value, "f")
    if t in (datetime.datetime, datetime.date, datetime.time):
        return value.isoformat()
    return str(value)  # uuid.UUID


def _protobuf(pool: Any, fd_proto: Any) -> tuple[Decode, Any]:
    """The decode function of the schema ``fd_proto`` (in ``pool`` with what it imports:
    :meth:`RegistryDecoder._pool_of`), and ``fd_proto`` itself (what a sink types columns from)."""
    from google.protobuf.message_factory import GetMessageClass

    package = fd_proto.package
    classes: dict[tuple[int, ...], Any] = {}

    def message_class(indexes: tuple[int, ...]) -> Any:
        cls = classes.get(indexes)
        if cls is None:
            messages, path = fd_proto.message_type, []
            for i in indexes:
                if not 0 <= i < len(messages):
                    raise ValueError(f"message index {list(indexes)} is not in the schema")
                path.append(messages[i].name)
                messages = messages[i].nested_type
            name = ".".join(path)
            cls = classes[indexes] = GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}" if package else name))
        return cls

    def decode(raw: bytes) -> Any:
        pos, count = _varint(raw, 5)
        if count == 0:
            indexes: tuple[int, ...] = (0,)
        else:
            found = []
            for _ in range(count):
                pos, index = _varint(raw, pos)
                found.append(index)
            indexes = tuple(found)
        msg = message_class(indexes)()
        msg.ParseFromString(raw[pos:])
        return jsonable(_message_dict(msg))

    return decode, fd_proto


_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def _descriptor(name: str, text: str | None, serialized: Callable[[], str | None]) -> Any:
    """The ``FileDescriptorProto`` of a Protobuf schema as a registry served it: a base64 descriptor as it is,
    anything else (``.proto`` text) asked again as one (``serialized()``)."""
    from confluent_kafka.schema_registry.common.protobuf import _str_to_proto

    if not text or not _BASE64.fullmatch(text):
        text = serialized()
    if not text:
        raise ValueError(f"the registry served no schema text for {name}")
    return _str_to_proto(name, text)


#: A well-known type read as the Connect logical type Confluent's ProtobufConverter makes of it (Timestamp).
TIMESTAMP = "google.protobuf.Timestamp"
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _message_dict(msg: Any) -> dict[str, Any]:
    """A message as a dict by field name: every field (proto3 defaults too), scalars as Python has them
    (int64 an int, bytes bytes), enums by name, messages as dicts (an unset one None), maps as dicts; a
    ``google.protobuf.Timestamp`` as ISO 8601 text with ``+00:00``, to the microsecond (what a
    ``timestamptz`` column holds; Connect's converter makes it a ``Timestamp`` of milliseconds)."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            sub = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar(sub, v) for k, v in value.items()}
        elif _repeated(field):
            out[field.name] = [_scalar(field, v) for v in value]
        elif field.message_type is not None:
            out[field.name] = _message_value(value) if msg.HasField(field.name) else None
        else:
            out[field.name] = _scalar(field, value)
    return out


def _repeated(field: Any) -> bool:
    return bool(field.is_repeated)


def _message_value(msg: Any) -> Any:
    if msg.DESCRIPTOR.full_name == TIMESTAMP:
        return (_EPOCH + datetime.timedelta(seconds=msg.seconds, microseconds=msg.nanos // 1000)).isoformat()
    return _message_dict(msg)


def _scalar(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        return _message_value(value)
    if field.enum_type is not None:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    return value


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (how Confluent writes message indexes) at ``pos``: (position after it, value)."""
    shift = result = 0
    while True:
        if pos >= len(raw):
            raise ValueError("truncated message indexes")
        b = raw[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return pos, (result >> 1) ^ -(result & 1)
        shift += 7
        if shift > 63:
            raise ValueError("malformed message indexes")


def _json_schema(schema: Any) -> Decode:
    from jsonschema.validators import validator_for

    document = json.loads(schema.schema_str)
    cls = validator_for(document)
    cls.check_schema(document)
    validator = cls(document)

    def decode(raw: bytes) -> Any:
        value = jsoncodec.decode_value(raw[5:])
        error = next(iter(validator.iter_errors(value)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the value"
            raise ValueError(f"{where}: {error.message}")
        return value

    return decode


def _referenced_by(schema_id: int, schema: Any) -> str:
    """How an error names the schemas ``schema_id`` references: "a schema referenced by schema id 7 (a v1, b v2)"."""
    refs = ", ".join(f"{r.subject} v{r.version}" for r in schema.references or ())
    return f"a schema referenced by schema id {schema_id} ({refs})"
