"""What Kafka Connect 3.5 to 4 added to the connector API: ``PATCH .../config``, ``PUT .../topics/reset``
and the plugin ``version`` in connector and task statuses.

Kept apart from :mod:`eosink.worker.control.rest.api` (the API as Connect 3 had it) so that each module stays one
readable page; the handlers take the same :class:`~eosink.worker.control.rest.api.ConnectApi`.

Active topics here are the topics the connector has a decision-log entry for (it consumed from
them). ``PUT .../topics/reset`` cannot forget those entries - they are the offsets - so it records
where each partition stood (``/connectors/<name>/topics_reset``): a topic is active again once
the connector delivers from it after the reset, as in Connect, where it reappears with the next
record consumed. Deleting the connector deletes that record with it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from eosink.worker import paths
from eosink.worker.control import plugins
from eosink.worker.control.rest.messages import ApiError, Request, Response
from eosink.worker.logging import get_logger

if TYPE_CHECKING:
    from eosink.worker.control.rest.api import ConnectApi

log = get_logger("eosink.worker.control.rest")


def plugin_version(config: dict[str, Any] | None) -> str:
    """The version of the connector's plugin (Connect 4's ``version`` in statuses); eosink's own when unknown."""
    plugin = plugins.find(str((config or {}).get("connector.class") or ""))
    return plugin.info()["version"] if plugin is not None else plugins.VERSION


def with_version(status: dict[str, Any], version: str) -> dict[str, Any]:
    """A connector status (``{"connector": {...}, "tasks": [...]}``) or one task status, with ``version``."""
    if "connector" in status:
        return {**status, "connector": {**status["connector"], "version": version},
                "tasks": [{**t, "version": version} for t in status.get("tasks", [])]}
    return {**status, "version": version}


# -- PATCH /connectors/{name}/config -----------------------------------------------------------------
def patch_config(api: ConnectApi, req: Request) -> Response:
    """Merge the given keys into the stored config (a null value removes the key), validated as a PUT is."""
    name = api._name(req)
    patch = req.json()
    if not isinstance(patch, dict):
        raise ApiError(400, "the body must be a JSON object of the keys to change (null removes a key)")
    current = dict(api.store.get(name) or {})
    for key, value in patch.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    cfg = api._validated(name, current)
    api.store.put(name, cfg)
    log.info("connector_configured", connector=name, patched=sorted(patch))
    return Response(200, api._info(name, cfg))


# -- topics ---------------------------------------------------------------------------------------------
def _reset_path(api: ConnectApi, name: str) -> str:
    return paths.connector(api.worker.session.root, name) + "/topics_reset"


def _marks(api: ConnectApi, name: str) -> dict[str, int | None]:
    from kazoo.exceptions import NoNodeError

    try:
        data = api.worker.session.client.get(_reset_path(api, name))[0]
    except NoNodeError:
        return {}
    marks: dict[str, int | None] = json.loads(data)
    return marks


def active_topics(api: ConnectApi, name: str) -> list[str]:
    """Topics with a partition delivered from since the last reset (every consumed topic when never reset)."""
    marks = _marks(api, name)
    out = set()
    for tp, entry in api.admin.decisions(name).items():
        key = f"{tp.topic}-{tp.partition}"
        if key not in marks or (entry.next_offset is not None and entry.next_offset != marks[key]):
            out.add(tp.topic)
    return sorted(out)


def topics(api: ConnectApi, req: Request) -> Response:
    name = api._name(req)
    return Response(200, {name: {"topics": active_topics(api, name)}})


def reset_topics(api: ConnectApi, req: Request) -> Response:
    """202 as Connect: the active topics set is empty until the connector delivers from a topic again."""
    from kazoo.exceptions import NodeExistsError, NoNodeError

    name = api._name(req)
    marks = {f"{tp.topic}-{tp.partition}": e.next_offset for tp, e in api.admin.decisions(name).items()}
    data = json.dumps(marks, sort_keys=True).encode()
    zk, path = api.worker.session.client, _reset_path(api, name)
    try:
        zk.set(path, data)
    except NoNodeError:
        try:
            zk.create(path, data)  # no makepath: a connector deleted meanwhile stays deleted
        except NoNodeError:
            raise ApiError(404, f"Connector {name} not found") from None
        except NodeExistsError:  # another reset won the race: the same marks
            zk.set(path, data)
    log.info("connector_topics_reset", connector=name, partitions=len(marks))
    return Response(202)
