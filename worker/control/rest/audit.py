"""``POST /connectors/{name}/audit`` (eosink's): the connector's sinks read back and checked against its outbox.

The body is optional: ``{"offsets": [{"kafka_topic": T, "kafka_partition": P, "from": A, "to": B}]}``
limits the audit to those ranges (``to`` exclusive); without it every partition is audited from its
earliest offset to the decision log's ``next_offset``. The answer is the report of
:func:`eosink.worker.audit.run.audit` with 200 whether or not it is clean (``ok`` tells): the
request succeeded, the data may not have. It runs in the request's thread, reading Kafka and every
sink: long for a large connector, and never a change to anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eosink.connectors.api.errors import ConfigError, EosinkError, RetryableError
from eosink.connectors.api.records import TopicPartition
from eosink.worker.control.rest.messages import ApiError, Request, Response

if TYPE_CHECKING:
    from eosink.worker.control.rest.api import ConnectApi


def _asked(body: Any) -> list[Any]:
    from eosink.worker.audit.run import Asked

    if body is None:
        return []
    items = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise ApiError(400, 'the body, when given, is {"offsets": [{"kafka_topic": ..., "kafka_partition": ..., '
                            '"from": ..., "to": ...}]}')
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ApiError(400, f"offsets[{i}] must be an object")
        topic = item.get("kafka_topic")
        whole = [v for v in (item.get(k) for k in ("kafka_partition", "from", "to"))
                 if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63]
        if len(whole) != 3 or not isinstance(topic, str) or not topic or len(topic) > 249 or whole[0] >= 2**31 \
                or whole[2] < whole[1]:
            raise ApiError(400, f"offsets[{i}] needs kafka_topic (a topic name), kafka_partition, from and to "
                                "(whole numbers, to >= from; to exclusive)")
        out.append(Asked(TopicPartition(topic, whole[0]), whole[1], whole[2]))
    return out


def audit(api: ConnectApi, req: Request) -> Response:
    from eosink.worker.audit.run import audit as run_audit

    name = api._name(req)
    asked = _asked(req.json() if req.body.strip() else None)
    raw = api.store.get(name) or {}
    try:
        report = run_audit(name, raw, api.admin.decisions(name), bootstrap=api.worker.bootstrap,
                           kafka=api.worker.kafka, asked=asked)
    except ConfigError as exc:
        raise ApiError(400, str(exc)) from None
    except RetryableError as exc:
        raise ApiError(503, str(exc)) from None
    except EosinkError as exc:
        raise ApiError(500, str(exc)) from None
    return Response(200, report)
