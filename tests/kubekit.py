"""The chart's rendered manifests, played with ``podman kube play`` on this machine (no Kubernetes here).

``podman kube play`` (Debian's 4.3) runs Pods, Deployments, ConfigMaps and Secrets, but no
controllers. What the chart renders is therefore played as close to as-is as podman allows, and
each change is made here, in one place, for a stated reason:

* **StatefulSet -> Pods** ``<name>-0`` .. ``<name>-N``: the pod template unchanged except below, so
  ``EOSINK_WORKER_ID`` still comes from ``fieldRef: metadata.name`` (podman resolves it to the pod's
  name, the id a StatefulSet gives).
* **Host network, a REST port per pod**: the stack's servers listen on 127.0.0.1 and three pods share
  the host's ports; the advertised URL is ``http://127.0.0.1:<port>`` because there is no cluster
  DNS (the chart's ``$(EOSINK_WORKER_ID).<headless service>`` needs one); the container ports go,
  as podman refuses port mappings on the host network.
* **Probes removed**: podman turns an ``httpGet`` probe into a ``curl`` inside the container, which
  the image does not carry; the test GETs the probes' own paths and ports from outside instead.
* **Secret -> ConfigMap with the same files at the same mount path**: podman 4.3.1 panics on a
  ``secret:`` volume (``VolumeFromSecret`` dereferences a nil secrets manager), measured here.
* **Job -> Pod** (``restartPolicy: Never``) with ``EOSINK_URL`` pointed at worker 0: no Job
  controller and no Service routing; its command, image and ConfigMap mount are the Job's own.
"""

from __future__ import annotations

import copy
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]
[engine]
runtime = "runc"
"""


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m.get("kind") == kind]


def _set_env(container: dict[str, Any], values: dict[str, str]) -> None:
    env = [e for e in container.get("env", []) if e["name"] not in values]
    container["env"] = env + [{"name": k, "value": v} for k, v in values.items()]


def _secret_as_configmap(secret: dict[str, Any]) -> dict[str, Any]:
    import base64

    data = dict(secret.get("stringData") or {})
    data.update({k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()})
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": secret["metadata"]["name"]}, "data": data}


def _podman_volumes(spec: dict[str, Any]) -> None:
    for vol in spec.get("volumes", []):
        if "secret" in vol:
            vol["configMap"] = {"name": vol.pop("secret")["secretName"]}


def worker_pods(statefulset: dict[str, Any], ports: list[int]) -> list[dict[str, Any]]:
    """The StatefulSet's pods, one per port (see the module docstring for what changes)."""
    name = statefulset["metadata"]["name"]
    template = statefulset["spec"]["template"]
    pods = []
    for i, port in enumerate(ports):
        spec = copy.deepcopy(template["spec"])
        spec["hostNetwork"] = True
        spec.pop("affinity", None)
        _podman_volumes(spec)
        for c in spec["containers"]:
            c.pop("livenessProbe", None)
            c.pop("readinessProbe", None)
            c.pop("ports", None)  # podman maps no ports on the host network (it refuses to)
            _set_env(c, {"EOSINK_REST_PORT": str(port), "EOSINK_REST_ADVERTISED_URL": f"http://127.0.0.1:{port}"})
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"{name}-{i}", "labels": dict(template["metadata"].get("labels", {}))}, "spec": spec})
    return pods


def job_pod(job: dict[str, Any], url: str, run: int = 0) -> dict[str, Any]:
    """The Job's pod, talking to ``url`` instead of the Service; ``run`` numbers the pods of later runs (upgrades)."""
    spec = copy.deepcopy(job["spec"]["template"]["spec"])
    spec["hostNetwork"] = True
    spec["restartPolicy"] = "Never"
    _podman_volumes(spec)
    for c in spec["containers"]:
        _set_env(c, {"EOSINK_URL": url})
    name = job["metadata"]["name"] + (f"-{run}" if run else "")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def config_objects(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ConfigMaps, and the Secrets as ConfigMaps."""
    return by_kind(manifests, "ConfigMap") + [_secret_as_configmap(s) for s in by_kind(manifests, "Secret")]


@dataclass
class KubePlay:
    """``podman kube play`` of YAML files written under ``folder``; :meth:`down` removes exactly those."""

    folder: Path
    played: list[Path] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        conf = self.folder / "containers.conf"
        if not conf.exists():
            conf.write_text(CONTAINERS_CONF)
        return {**os.environ, "CONTAINERS_CONF": str(conf)}

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        r = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:4])} failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
        return r.stdout

    def play(self, docs: list[dict[str, Any]], name: str) -> Path:
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        self.played.append(path)
        self.podman("kube", "play", str(path))
        return path

    def state(self, container: str) -> tuple[str, int]:
        out = self.podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container).split()
        return out[0], int(out[1])

    def restart(self, pod: str, timeout: float = 30) -> None:
        """Start a pod again after its container died, as the kubelet restarts a crashed container.

        kube play gives pods the exit policy "stop": once the container dies podman stops the pod's
        infra container too, asynchronously. Starting the container alone races that stop (runc then
        finds no namespaces to join), so wait until the pod has exited and start the whole pod.
        """
        deadline = time.monotonic() + timeout
        while (state := self.podman("pod", "inspect", pod, "--format", "{{.State}}").strip()) != "Exited":
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {pod} still {state} {timeout:.0f} s after its container died")
            time.sleep(0.2)
        self.podman("pod", "start", pod)

    def logs(self, container: str) -> str:
        r = subprocess.run(["podman", "logs", container], env=self.env, capture_output=True, text=True, check=False)
        return r.stdout + r.stderr

    def down(self) -> None:
        for path in reversed(self.played):
            subprocess.run(["podman", "kube", "down", str(path)], env=self.env, capture_output=True, check=False, timeout=120)


def kube_play(root: Path | None = None) -> KubePlay:
    return KubePlay(Path(tempfile.mkdtemp(prefix="eosink-kube-", dir=root)))
