"""The OpenAPI 3.0 document served at ``/openapi.json`` (and fuzzed by schemathesis in tests/test_rest.py).

Written out here rather than derived: the stdlib server has no framework to derive it from, and
the schemathesis run in the tests is what keeps this document and the routing table in agreement.
"""

from __future__ import annotations

from typing import Any

from eosink.worker.control.plugins import VERSION


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}, "description": "connector name"}
_TASK = {"name": "task", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}}
_PLUGIN = {"name": "plugin", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "alias (postgres), class name or simple class name"}
_LOGGER = {"name": "logger", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "logger name (eosink.worker.control.rest, ...) or root"}
_DEFAULT = {"default": _error("an error: 400 bad request, 401 unauthenticated, 503 ZooKeeper unavailable, ...")}
_NOT_FOUND = {"404": _error("no such connector")}


def _op(summary: str, responses: dict[str, Any], *, params: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None, tag: str = "connectors") -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": [tag], "responses": {**responses, **_DEFAULT}}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


_CONFIG_VALUE = {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"},
                           {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}}]}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error_code", "message"],
              "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}}},
    "Config": {"type": "object", "additionalProperties": _CONFIG_VALUE,
               "description": "Kafka Connect-style configuration; password-typed values are shown as [hidden]"},
    "NewConnector": {"type": "object", "required": ["name", "config"],
                     "properties": {"name": {"type": "string"}, "config": _ref("Config"),
                                    "initial_state": {"type": "string", "enum": ["RUNNING", "PAUSED", "STOPPED"]}}},
    "ConnectorInfo": {"type": "object", "required": ["name", "config", "tasks", "type"], "properties": {
        "name": {"type": "string"}, "config": {"type": "object"}, "type": {"type": "string", "enum": ["sink"]},
        "tasks": {"type": "array", "items": {"type": "object", "properties": {
            "connector": {"type": "string"}, "task": {"type": "integer"}}}}}},
    "TaskStatus": {"type": "object", "required": ["id", "state", "worker_id"], "properties": {
        "id": {"type": "integer"}, "worker_id": {"type": "string"}, "trace": {"type": "string"},
        "state": {"type": "string", "enum": ["UNASSIGNED", "RUNNING", "PAUSED", "FAILED", "RESTARTING"]},
        "version": {"type": "string"}, "eosink_state": {"type": "string"},
        "partitions": {"type": "array", "items": {"type": "object", "properties": {
            "partition": {"type": "string"}, "epoch": {"type": ["integer", "null"]}, "lag": {"type": ["integer", "null"]},
            "delivered": {"type": "integer"},
            "stalled_behind_open_transaction_s": {"type": "integer", "description": "present while the partition's position "
                                                  "stands and its high watermark moves: read_committed waits behind an open "
                                                  "transaction"}}}},
        "unresolved": {"type": "array", "items": {"type": "object"}}}},
    "ConnectorStatus": {"type": "object", "required": ["name", "connector", "tasks", "type"], "properties": {
        "name": {"type": "string"}, "type": {"type": "string"},
        "connector": {"type": "object", "required": ["state", "worker_id"], "properties": {
            "state": {"type": "string", "enum": ["UNASSIGNED", "RUNNING", "PAUSED", "STOPPED", "FAILED", "RESTARTING"]},
            "worker_id": {"type": "string"}, "trace": {"type": "string"}, "version": {"type": "string"}}},
        "tasks": {"type": "array", "items": _ref("TaskStatus")}}},
    "Offsets": {"type": "object", "required": ["offsets"], "properties": {"offsets": {"type": "array", "items": {
        "type": "object", "required": ["partition", "offset"], "properties": {
            "partition": {"type": "object", "required": ["kafka_topic", "kafka_partition"], "properties": {
                "kafka_topic": {"type": "string"}, "kafka_partition": {"type": "integer", "minimum": 0}}},
            "offset": {"oneOf": [{"type": "object", "required": ["kafka_offset"], "properties": {
                "kafka_offset": {"type": "integer", "minimum": 0}}}], "nullable": True}}}}}},
    "Message": {"type": "object", "required": ["message"], "properties": {"message": {"type": "string"}}},
    "PluginInfo": {"type": "object", "required": ["class", "type"], "properties": {
        "class": {"type": "string"}, "type": {"type": "string"}, "version": {"type": "string"}}},
    "ConfigKeyInfo": {"type": "object", "required": ["name", "type", "required", "importance", "documentation"],
                      "properties": {"name": {"type": "string"}, "type": {"type": "string"}, "required": {"type": "boolean"},
                                     "default_value": {"type": "string", "nullable": True},
                                     "importance": {"type": "string"}, "documentation": {"type": "string"},
                                     "group": {"type": "string"}, "order": {"type": "integer"}}},
    "ConfigInfos": {"type": "object", "required": ["name", "error_count", "groups", "configs"], "properties": {
        "name": {"type": "string"}, "error_count": {"type": "integer"}, "groups": {"type": "array", "items": {"type": "string"}},
        "configs": {"type": "array", "items": {"type": "object", "required": ["definition", "value"], "properties": {
            "definition": _ref("ConfigKeyInfo"),
            "value": {"type": "object", "required": ["name", "errors"], "properties": {
                "name": {"type": "string"}, "value": {"type": "string", "nullable": True},
                "errors": {"type": "array", "items": {"type": "string"}}}}}}}}},
    "Transactions": {"type": "object", "required": ["connector", "transactions"], "properties": {
        "connector": {"type": "string"}, "errors": {"type": "array", "items": {"type": "object"}},
        "transactions": {"type": "array", "items": {"type": "object", "required": ["txn", "state", "partitions"], "properties": {
            "txn": {"type": "string"}, "state": {"type": "string", "enum": ["DECIDED", "FENCED", "PREPARED", "IN_DOUBT"]},
            "partitions": {"type": "array", "items": {"type": "string"}}, "sinks": {"type": "array", "items": {"type": "string"}},
            "reason": {"type": "string"}, "reported_by": {"type": "string"}}}}}},
    "AuditRange": {"type": "object", "required": ["kafka_topic", "kafka_partition", "from", "to"], "properties": {
        "kafka_topic": {"type": "string", "minLength": 1, "maxLength": 249},
        "kafka_partition": {"type": "integer", "minimum": 0, "maximum": 2147483647},
        "from": {"type": "integer", "minimum": 0}, "to": {"type": "integer", "minimum": 0}}},
    "AuditReport": {"type": "object", "required": ["connector", "ok", "sinks"], "properties": {
        "connector": {"type": "string"}, "ok": {"type": "boolean"}, "notes": {"type": "array", "items": {"type": "string"}},
        "source": {"type": "object"}, "seconds": {"type": "number"},
        "sinks": {"type": "array", "items": {"type": "object", "required": ["sink", "audited"], "properties": {
            "sink": {"type": "string"}, "audited": {"type": "boolean"}, "clean": {"type": ["boolean", "null"]},
            "limit": {"type": ["string", "null"]}, "error": {"type": ["string", "null"]}, "totals": {"type": "object"},
            "partitions": {"type": "array", "items": {"type": "object"}}}}}}},
    "LoggerLevel": {"type": "object", "required": ["level", "last_modified"], "properties": {
        "level": {"type": "string"}, "last_modified": {"type": ["integer", "null"]}}},
    "Probe": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}, "message": {"type": "string"}}},
}


def _nullable_types(schema: Any) -> Any:
    """OpenAPI 3.0 has no ``"type": [..., "null"]``: rewrite to ``nullable``."""
    if isinstance(schema, dict):
        out = {k: _nullable_types(v) for k, v in schema.items()}
        t = out.get("type")
        if isinstance(t, list) and "null" in t:
            rest = [x for x in t if x != "null"]
            out["type"] = rest[0]
            out["nullable"] = True
        return out
    if isinstance(schema, list):
        return [_nullable_types(v) for v in schema]
    return schema


def _audit_op() -> dict[str, Any]:
    """The audit's body is optional (no body: every partition up to the decision log's next_offset)."""
    op = _op("read every sink back and check it against the outbox: missing, duplicated, foreign, in flight", {
        "200": _json(_ref("AuditReport"), "the report; ok is false when a due record is missing, duplicated, "
                     "superseded, or a foreign record is present"),
        "400": _error("a malformed range or configuration"), "503": _error("Kafka or a sink could not be read"),
        **_NOT_FOUND}, params=[_NAME],
        body={"type": "object", "properties": {"offsets": {"type": "array", "items": _ref("AuditRange")}}})
    op["requestBody"]["required"] = False
    return op


def document() -> dict[str, Any]:
    accepted = {"202": {"description": "accepted: workers act on it at their next reconcile (about a second)"}}
    paths = {
        "/": {"get": _op("worker and cluster version", {"200": _json({"type": "object", "properties": {
            "version": {"type": "string"}, "commit": {"type": "string"}, "kafka_cluster_id": {"type": "string", "nullable": True}}},
            "version")}, tag="worker")},
        "/health": {"get": _op("liveness", {"200": _json(_ref("Probe"), "healthy"), "500": _json(_ref("Probe"), "unhealthy"),
                                            "503": _json(_ref("Probe"), "starting")}, tag="worker")},
        "/ready": {"get": _op("readiness: connected to ZooKeeper and a member of the cluster",
                              {"200": _json(_ref("Probe"), "ready"), "503": _json(_ref("Probe"), "not ready")}, tag="worker")},
        "/metrics": {"get": _op("Prometheus metrics", {"200": {"description": "text exposition format",
                                                               "content": {"text/plain": {"schema": {"type": "string"}}}}},
                                tag="worker")},
        "/connectors": {
            "get": _op("connector names (expand=status|info for details)", {"200": _json(
                {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "object"}]}, "connectors")},
                params=[{"name": "expand", "in": "query", "required": False, "style": "form", "explode": True,
                         "schema": {"type": "array", "items": {"type": "string", "enum": ["status", "info"]}}}]),
            "post": _op("create a connector", {"201": _json(_ref("ConnectorInfo"), "created"),
                                               "400": _error("invalid configuration (names the key)"),
                                               "409": _error("a connector of that name exists")},
                        body=_ref("NewConnector")),
        },
        "/connectors/{name}": {
            "get": _op("connector info", {"200": _json(_ref("ConnectorInfo"), "info"), **_NOT_FOUND}, params=[_NAME]),
            "delete": _op("delete a connector (its decision log stays: re-creating it resumes where it was)",
                          {"204": {"description": "deleted"}, **_NOT_FOUND}, params=[_NAME]),
        },
        "/connectors/{name}/config": {
            "get": _op("configuration (passwords hidden)", {"200": _json(_ref("Config"), "config"), **_NOT_FOUND}, params=[_NAME]),
            "put": _op("create or update", {"200": _json(_ref("ConnectorInfo"), "updated"),
                                            "201": _json(_ref("ConnectorInfo"), "created"),
                                            "400": _error("invalid configuration (names the key)")},
                       params=[_NAME], body=_ref("Config")),
            "patch": _op("merge keys into the configuration (a null value removes the key)", {
                "200": _json(_ref("ConnectorInfo"), "updated"), "400": _error("the merged configuration is invalid"),
                **_NOT_FOUND}, params=[_NAME], body={"type": "object", "additionalProperties": {
                    "oneOf": [_CONFIG_VALUE], "nullable": True}}),
        },
        "/connectors/{name}/status": {"get": _op("connector and task states", {
            "200": _json(_ref("ConnectorStatus"), "status"), **_NOT_FOUND}, params=[_NAME])},
        "/connectors/{name}/tasks": {"get": _op("tasks and their configs", {"200": _json({"type": "array", "items": {
            "type": "object", "properties": {"id": {"type": "object"}, "config": {"type": "object"}}}}, "tasks"), **_NOT_FOUND},
            params=[_NAME])},
        "/connectors/{name}/tasks/{task}/status": {"get": _op("one task's state", {
            "200": _json(_ref("TaskStatus"), "status"), "404": _error("no such connector or task")}, params=[_NAME, _TASK])},
        "/connectors/{name}/tasks/{task}/restart": {"post": _op("restart one task", {
            "204": {"description": "restart requested"}, "404": _error("no such connector or task")}, params=[_NAME, _TASK])},
        "/connectors/{name}/pause": {"put": _op("pause: tasks keep their partitions, cycles stop",
                                                {**accepted, **_NOT_FOUND}, params=[_NAME])},
        "/connectors/{name}/resume": {"put": _op("resume", {**accepted, **_NOT_FOUND}, params=[_NAME])},
        "/connectors/{name}/stop": {"put": _op("stop: tasks stop, partitions released", {
            "204": {"description": "stop requested"}, **_NOT_FOUND}, params=[_NAME])},
        "/connectors/{name}/restart": {"post": _op("restart the connector's tasks", {
            "204": {"description": "restart requested (no parameters)"},
            "202": _json(_ref("ConnectorStatus"), "restart requested; the tasks being restarted are RESTARTING"),
            **_NOT_FOUND}, params=[_NAME,
                                   {"name": "includeTasks", "in": "query", "required": False, "schema": {"type": "boolean"}},
                                   {"name": "onlyFailed", "in": "query", "required": False, "schema": {"type": "boolean"}}])},
        "/connectors/{name}/topics": {"get": _op("topics the connector has consumed", {
            "200": _json({"type": "object", "additionalProperties": {"type": "object", "properties": {
                "topics": {"type": "array", "items": {"type": "string"}}}}}, "active topics"), **_NOT_FOUND}, params=[_NAME])},
        "/connectors/{name}/topics/reset": {"put": _op("empty the active topics (until the connector delivers from one again)",
                                                       {**accepted, **_NOT_FOUND}, params=[_NAME])},
        "/connectors/{name}/offsets": {
            "get": _op("next offset to deliver per partition (the decision log)",
                       {"200": _json(_ref("Offsets"), "offsets"), **_NOT_FOUND}, params=[_NAME]),
            "patch": _op("alter offsets (connector must be STOPPED)", {
                "200": _json(_ref("Message"), "altered"), "400": _error("bad request, or the connector is not STOPPED"),
                "409": _error("a worker is still stopping a task"), **_NOT_FOUND}, params=[_NAME], body=_ref("Offsets")),
            "delete": _op("reset offsets to consumer.auto.offset.reset (connector must be STOPPED)", {
                "200": _json(_ref("Message"), "reset"), "400": _error("the connector is not STOPPED"),
                "409": _error("a worker is still stopping a task"), **_NOT_FOUND}, params=[_NAME]),
        },
        "/connectors/{name}/transactions": {"get": _op("prepared transactions and what recovery will do with them", {
            "200": _json(_ref("Transactions"), "transactions"), **_NOT_FOUND}, params=[_NAME])},
        "/connectors/{name}/audit": {"post": _audit_op()},
        "/connector-plugins": {"get": _op("installed connector classes", {
            "200": _json({"type": "array", "items": _ref("PluginInfo")}, "plugins")}, tag="plugins")},
        "/connector-plugins/{plugin}/config": {"get": _op("declared configuration of a plugin", {
            "200": _json({"type": "array", "items": _ref("ConfigKeyInfo")}, "keys"), "404": _error("no such plugin")},
            params=[_PLUGIN], tag="plugins")},
        "/connector-plugins/{plugin}/config/validate": {"put": _op("validate a configuration", {
            "200": _json(_ref("ConfigInfos"), "every key with its value and errors"),
            "400": _error("not a configuration, or connector.class names another plugin"), "404": _error("no such plugin")},
            params=[_PLUGIN], body=_ref("Config"), tag="plugins")},
        "/admin/loggers": {"get": _op("every logger of this worker with its level", {
            "200": _json({"type": "object", "additionalProperties": _ref("LoggerLevel")}, "loggers")}, tag="admin")},
        "/admin/loggers/{logger}": {
            "get": _op("one logger's level", {"200": _json(_ref("LoggerLevel"), "level"), "404": _error("no such logger")},
                       params=[_LOGGER], tag="admin"),
            "put": _op("set the level of a logger and every logger below it, in this worker", {
                "200": _json({"type": "array", "items": {"type": "string"}}, "the loggers whose level was set"),
                "400": _error("no or an unknown level, or scope=cluster (not supported)")},
                params=[_LOGGER, {"name": "scope", "in": "query", "required": False,
                                  "schema": {"type": "string", "enum": ["worker", "cluster"], "default": "worker"}}],
                body={"type": "object", "required": ["level"], "properties": {"level": {
                    "type": "string", "enum": ["OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL"]}}},
                tag="admin"),
        },
    }
    return _nullable_types({
        "openapi": "3.0.3",
        "info": {"title": "eosink REST API", "version": VERSION,
                 "description": "Kafka Connect's REST API for eosink's exactly-once sink workers. Errors are "
                                '{"error_code": ..., "message": ...}.'},
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": {"basic": {"type": "http", "scheme": "basic"},
                                                               "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"basic": []}, {"bearer": []}],
    })
