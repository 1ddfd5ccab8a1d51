"""A real Prometheus on loopback over eosink workers, with the shipped alert rules (tests, ``make observe``).

The rules and the scrape config are read from ``docker/observability/`` - the files an operator
deploys - and only rewritten where a drill must be quicker: the targets, the intervals and every
rule's ``for:``. A copy of the rules edited by hand would drift from what is shipped; a rewrite
cannot. Prometheus and promtool are built once from their Go module (:mod:`eosink.worker.stack.gotools`).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from eosink.worker.stack.errors import ComponentError
from eosink.worker.stack.gotools import go_binary

MODULE = "github.com/prometheus/prometheus"
VERSION = "v0.316.0"
OBSERVABILITY = Path(__file__).resolve().parents[2] / "docker" / "observability"
COMPONENT = "prometheus"


def binaries() -> dict[str, Path]:
    """``{"prometheus": path, "promtool": path}``, built on first use."""
    return go_binary(MODULE, VERSION, ["prometheus", "promtool"], component=COMPONENT)


def rules_with_for(text: str, duration: str) -> str:
    """The rules file with every ``for:`` set to ``duration`` (rules without one keep none)."""
    if not re.fullmatch(r"\d+(ms|s|m|h)", duration):
        raise ValueError(f"for: duration {duration!r} is not a Prometheus duration like 5s or 1m")
    return re.sub(r"(?m)^(\s*)for:\s*\S+\s*$", rf"\g<1>for: {duration}", text)


def scrape_config(targets: Sequence[str], interval: str) -> dict[str, Any]:
    """``prometheus.yml`` with job ``eosink`` scraping ``targets`` every ``interval``."""
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = ["alerts.yml"]
    jobs = [j for j in config["scrape_configs"] if j["job_name"] == "eosink"]
    if not jobs:
        raise ComponentError(COMPONENT, f"{OBSERVABILITY / 'prometheus.yml'} has no job_name: eosink", None)
    job = {k: v for k, v in jobs[0].items() if not k.endswith("_sd_configs") and k != "relabel_configs"}
    job["static_configs"] = [{"targets": list(targets)}]
    config["scrape_configs"] = [job]
    return config


class LocalPrometheus:
    """Prometheus serving on ``127.0.0.1:port`` with its data, config and log under ``workdir``."""

    def __init__(self, workdir: Path, targets: Sequence[str], port: int, *, interval: str = "1s",
                 alert_for: str | None = None) -> None:
        self.workdir, self.port = workdir, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "prometheus.log"
        if not (OBSERVABILITY / "alerts.yml").is_file():
            raise ComponentError(COMPONENT, f"the alert rules {OBSERVABILITY / 'alerts.yml'} are missing: run from a "
                                 "checkout of the repository (pip install -e .), where docker/observability/ is", None)
        workdir.mkdir(parents=True, exist_ok=True)
        rules = (OBSERVABILITY / "alerts.yml").read_text()
        (workdir / "alerts.yml").write_text(rules_with_for(rules, alert_for) if alert_for else rules)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(scrape_config(targets, interval), sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> LocalPrometheus:
        exe = binaries()["prometheus"]
        argv = [str(exe), f"--config.file={self.workdir / 'prometheus.yml'}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ComponentError(COMPONENT, f"exited with {self.proc.returncode} at start-up", self.log_path,
                                     self._tail())
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).read()
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise ComponentError(COMPONENT, f"not ready on {self.url} within {timeout:.0f} s", self.log_path, self._tail())

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise ComponentError(COMPONENT, f"GET /api/v1/{path} answered {body}", self.log_path)
        return body["data"]

    def alerts(self, state: str = "firing") -> list[dict[str, Any]]:
        """The alerts in ``state`` (firing or pending), each with ``labels`` and ``annotations``."""
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return list(self.api("query?" + urllib.parse.urlencode({"query": promql}))["result"])

    def targets_up(self) -> dict[str, bool]:
        return {t["labels"]["instance"]: t["health"] == "up" for t in self.api("targets")["activeTargets"]}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def _tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""


def promtool_test_rules(test_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` on the shipped rules' unit tests (``alerts_test.yml``)."""
    path = test_file or OBSERVABILITY / "alerts_test.yml"
    return subprocess.run([str(binaries()["promtool"]), "test", "rules", path.name], cwd=path.parent,
                          capture_output=True, text=True, timeout=120, check=False)
