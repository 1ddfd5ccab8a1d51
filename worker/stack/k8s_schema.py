"""Kubernetes manifests checked offline against the API schemas of a pinned Kubernetes release.

Without a cluster, ``kubectl apply --dry-run=client`` validates nothing (its schemas come from an
API server), and tools like kubeconform download JSON schemas from a web site at run time. The
Kubernetes source itself publishes the API server's OpenAPI v3 documents (``api/openapi-spec/v3``,
one per group/version, with every required field, type and enum); its Go module is served by the
Go module proxy, so ``go mod download k8s.io/kubernetes@<version>`` (a 21 MB zip, cached in the
module cache, no build) brings exactly that release's schemas. They are checked with
``jsonschema`` as an API server would parse them with field validation ``Strict``: an unknown
field is an error (``additionalProperties: false`` on every object that lists its properties), as
is a missing required field or a wrong type.

Kinds that are not built in (the Prometheus Operator's ServiceMonitor and PrometheusRule) are not
in these documents; :func:`validate` reports them as unchecked rather than passing them silently.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from eosink.worker.stack.errors import ComponentError

MODULE = "k8s.io/kubernetes"
VERSION = "v1.34.0"
COMPONENT = "kubernetes-schemas"
#: metadata.name of most kinds: a DNS subdomain; Services and the pods' own names need DNS labels.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_LABEL_KINDS = {"Service", "StatefulSet"}


def spec_dir() -> Path:
    """``api/openapi-spec/v3`` of :data:`MODULE` at :data:`VERSION`, downloaded once into Go's module cache."""
    go = shutil.which("go")
    if go is None:
        raise ComponentError(COMPONENT, f"the Go toolchain (`go`) is needed once to download {MODULE}@{VERSION}'s "
                             "OpenAPI documents from the Go module proxy (apt-get install golang-go)", None)
    with tempfile.TemporaryDirectory(prefix="eosink-gomod-") as d:  # outside any module: no go.mod is read or changed
        r = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], cwd=d, capture_output=True, text=True,
                           timeout=600, env={**os.environ, "GOFLAGS": "-mod=mod"}, check=False)
    info = json.loads(r.stdout or "{}")
    if r.returncode != 0 or "Dir" not in info:
        raise ComponentError(COMPONENT, f"`go mod download {MODULE}@{VERSION}` failed: {info.get('Error') or r.stderr.strip()}", None)
    folder = Path(info["Dir"]) / "api" / "openapi-spec" / "v3"
    if not folder.is_dir():
        raise ComponentError(COMPONENT, f"{folder} is missing from {MODULE}@{VERSION}", None)
    return folder


def _document_name(api_version: str) -> str:
    group, _, version = api_version.rpartition("/")
    return f"apis__{group}__{version}_openapi.json" if group else f"api__{version}_openapi.json"


def _strict(node: Any) -> Any:
    """Every object schema that lists its properties accepts no others (the API server's Strict field validation)."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.lru_cache(maxsize=32)
def _components(folder: str, api_version: str) -> dict[str, Any] | None:
    path = Path(folder) / _document_name(api_version)
    if not path.is_file():
        return None
    schemas: dict[str, Any] = json.loads(path.read_text())["components"]["schemas"]
    strict: dict[str, Any] = _strict(copy.deepcopy(schemas))
    return strict


def _schema_name(schemas: dict[str, Any], api_version: str, kind: str) -> str | None:
    group, _, version = api_version.rpartition("/")
    for name, schema in schemas.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            if (gvk.get("group", ""), gvk.get("version"), gvk.get("kind")) == (group, version, kind):
                return name
    return None


def validate(manifest: dict[str, Any], folder: Path | None = None) -> list[str]:
    """Errors of one manifest (empty when the API server would accept it); ``unchecked: ...`` for unknown kinds."""
    import jsonschema

    api_version, kind = manifest.get("apiVersion", ""), manifest.get("kind", "")
    name = (manifest.get("metadata") or {}).get("name", "")
    where = f"{kind or '?'} {name or '?'}"
    if not api_version or not kind:
        return [f"{where}: apiVersion and kind are required"]
    errors: list[str] = []
    if not name:
        errors.append(f"{where}: metadata.name is required")
    elif kind in DNS_LABEL_KINDS and not DNS_LABEL.match(name):
        errors.append(f"{where}: metadata.name {name!r} is not a DNS label (a-z, 0-9, '-', at most 63)")
    schemas = _components(str(folder or spec_dir()), api_version)
    schema_name = _schema_name(schemas, api_version, kind) if schemas else None
    if schemas is None or schema_name is None:
        return [*errors, f"unchecked: {where} ({api_version} is not a built-in API of Kubernetes {VERSION})"]
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": {"schemas": schemas}}
    validator = jsonschema.Draft7Validator(root)
    for e in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in e.absolute_path) or "(root)"
        errors.append(f"{where}: {path}: {e.message[:300]}")
    return errors
