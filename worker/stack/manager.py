"""Bring the stack up and down, idempotently, and report what runs.

Every operation that starts or stops servers holds ``<home>/stack/run/.lock``: two ``up`` calls
on one home (parallel make targets, a test next to a shell) take turns instead of racing to
start the same server twice. ``status`` only reads, and takes no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eosink.worker.stack import proc
from eosink.worker.stack import secure as secure_material
from eosink.worker.stack.components import COMPONENTS, Component, kafka, kafka_config, zookeeper_ensemble
from eosink.worker.stack.endpoints import remove_endpoints, write_endpoints
from eosink.worker.stack.errors import ComponentError, StackError
from eosink.worker.stack.layout import HOST, StackLayout

Report = Callable[[str], None]

# How long a running server may fail its probe before `up` calls it unhealthy instead of
# leaving it alone.
UNHEALTHY_GRACE_S = 15.0


def _quiet(_: str) -> None:
    """Default reporter: the API is silent; the CLI passes a printer."""


@dataclass(frozen=True)
class ComponentStatus:
    """One line of ``eosink stack status``."""

    name: str
    state: str  # "running" | "unhealthy" (alive but not answering) | "stopped"
    pid: int | None
    address: str
    endpoint: dict[str, Any]
    log: Path

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "pid": self.pid, "address": self.address,
                "endpoint": self.endpoint, "log": str(self.log)}


def select(names: Iterable[str] | None, layout: StackLayout, brokers: int | None = None,
           zookeeper_nodes: int | None = None) -> list[Component]:
    """Component objects for ``names`` (all when None), in the stack's canonical order.

    ``kafka`` stands for every Kafka node (one unless the stack runs several, see
    :mod:`kafka_config`); ``kafka-<n>`` for node n alone (``kafka-1`` is node 1, listed as ``kafka``).
    ``zookeeper`` likewise stands for every node of a ZooKeeper ensemble (:mod:`zookeeper_ensemble`).
    """
    nodes = kafka.nodes(layout, brokers)
    zk_nodes = zookeeper_ensemble.nodes(layout, zookeeper_nodes)
    aliases = {f"kafka-{n}": node.name for n, node in enumerate(nodes, 1)}
    aliases |= {f"zookeeper-{n}": node.name for n, node in enumerate(zk_nodes, 1)}
    wanted = list(COMPONENTS) if names is None else [aliases.get(n, n) for n in names]
    unknown = [n for n in wanted if n not in COMPONENTS and n not in aliases.values()]
    if unknown:
        choices = [*COMPONENTS, *[alias for alias, name in aliases.items() if alias == name]]
        raise StackError(f"unknown component(s) {', '.join(unknown)}; choose from {', '.join(choices)}")
    chosen: list[Component] = []
    for name, cls in COMPONENTS.items():
        if name == kafka.Kafka.name:
            chosen += [node for node in nodes if name in wanted or node.name in wanted]
        elif name == zookeeper_ensemble.ZooKeeper.name:
            chosen += [zk for zk in zk_nodes if name in wanted or zk.name in wanted]
        elif name in wanted:
            chosen.append(cls(layout))
    return chosen


def up(names: Iterable[str] | None = None, home: Path | None = None, report: Report = _quiet,
       brokers: int | None = None, secure: bool | None = None,
       zookeeper_nodes: int | None = None) -> list[ComponentStatus]:
    """Start every selected component that is not already running and healthy; write endpoints.json.

    Components start concurrently (Kafka runs KRaft, not ZooKeeper), except those whose ``after``
    names another selected one (the registry keeps its schemas in PostgreSQL): they start in a
    second wave. All failures are collected and raised together, so one run shows every problem.
    endpoints.json always lists every component's address (they follow from the config alone), also
    after ``up --only``; ``status`` tells which servers actually run. ``brokers`` is the Kafka
    node count (default: ``EOSINK_KAFKA_BROKERS``, else what this home ran last, else 1);
    ``zookeeper_nodes`` the ZooKeeper node count, likewise (``EOSINK_ZOOKEEPER_NODES``).
    ``secure=True`` makes a new home a locked-down stack (see :mod:`eosink.worker.stack.secure`);
    ``None`` keeps what the home is.
    """
    layout = _layout_for_up(home, secure)
    layout.ensure()
    components = select(names, layout, brokers, zookeeper_nodes)
    with proc.file_lock(layout.lock_file):
        if layout.secure:
            secure_material.ensure(layout)
            layout.secure_marker.touch()
        if any(isinstance(c, kafka.Kafka) for c in components):
            kafka_config.record_count(layout, kafka_config.broker_count(layout, brokers))
        if any(isinstance(c, zookeeper_ensemble.ZooKeeper) for c in components):
            zookeeper_ensemble.record_count(layout, zookeeper_ensemble.node_count(layout, zookeeper_nodes))
        errors = _in_waves(components, lambda c: _ensure_running(c, report))
        if errors:
            raise StackError("\n\n".join(str(e) for e in errors))
        entries = {c.name: c.endpoint() for c in select(None, layout) if c.name in COMPONENTS}
        if layout.secure:
            entries["security"] = secure_material.endpoint(layout)
        write_endpoints(layout, entries)
    return status(names, home)


def _layout_for_up(home: Path | None, secure: bool | None) -> StackLayout:
    """The home's layout; a home whose servers were formatted open cannot turn secure, nor back.

    Kafka's SCRAM users and PostgreSQL's roles and auth rules are written when their data is first
    made, so switching would leave a server that half-enforces: refuse, and say how to start over.
    """
    current = StackLayout.for_home(home)
    if secure is None or secure == current.secure:
        return current
    formatted = [c for c in ("kafka", "zookeeper", "postgres", "s3") if current.data_dir(c).exists()]
    if formatted:
        now, want = ("secure", "open") if current.secure else ("open", "secure")
        raise StackError(
            f"the stack under {current.root} was made {now} ({', '.join(formatted)} already have data), "
            f"so it cannot be started {want}; run `eosink stack down`, then use another EOSINK_HOME for the "
            f"{want} stack (or remove {current.root} to start over)")
    return StackLayout.for_home(home, secure)


def down(names: Iterable[str] | None = None, home: Path | None = None, report: Report = _quiet) -> None:
    """Stop the selected components (all by default) and remove their pid files; idempotent.

    Stopping everything also removes endpoints.json, so ``load_endpoints`` then says the
    stack is not running instead of handing out dead addresses.
    """
    layout = StackLayout.for_home(home)
    components = select(names, layout)
    with proc.file_lock(layout.lock_file):
        errors = _in_waves(components, lambda c: _stop(c, report), reverse=True)
        if names is None:
            remove_endpoints(layout)
    if errors:
        raise StackError("\n\n".join(str(e) for e in errors))


def status(names: Iterable[str] | None = None, home: Path | None = None) -> list[ComponentStatus]:
    """What runs now: pid file alive and the readiness probe answering."""
    layout = StackLayout.for_home(home)
    components = select(names, layout)
    with ThreadPoolExecutor(max_workers=len(components)) as pool:
        return list(pool.map(_status, components))


def start_component(name: str, home: Path | None = None) -> int:
    """Start one component (no-op if it runs and answers); returns its pid. For crash tests."""
    up([name], home)
    pid = select([name], StackLayout.for_home(home))[0].running_pid()
    if pid is None:
        raise StackError(f"{name} started but its pid file does not name a live process")
    return pid


def stop_component(name: str, home: Path | None = None) -> None:
    """Stop one component, leaving the others (and endpoints.json) alone. For crash tests."""
    down([name], home)


def _in_waves(components: list[Component], action: Callable[[Component], object], *,
              reverse: bool = False) -> list[StackError]:
    """``_each`` on the components that need none of the others first, then on the rest (``reverse``:
    the rest first, as ``down`` stops them: the registry before the PostgreSQL it keeps its schemas in)."""
    names = {c.name for c in components}
    later = [c for c in components if names.intersection(c.after)]
    waves = [[c for c in components if c not in later], later]
    errors: list[StackError] = []
    for wave in reversed(waves) if reverse else waves:
        errors += _each(wave, action) if wave else []
    return errors


def _each(components: list[Component], action: Callable[[Component], object]) -> list[StackError]:
    """Run ``action`` on every component concurrently; return the errors, in component order."""
    def attempt(component: Component) -> StackError | None:
        try:
            action(component)
        except StackError as e:
            return e
        return None

    with ThreadPoolExecutor(max_workers=len(components)) as pool:
        return [e for e in pool.map(attempt, components) if e is not None]


def _ensure_running(component: Component, report: Report) -> None:
    name = component.name
    pid = component.running_pid()
    if pid is not None:
        if _answers_within(component, UNHEALTHY_GRACE_S):
            report(f"{name}: already running (pid {pid})")
            return
        raise component.fail(
            f"pid {pid} (from {component.pid_file}) runs but does not answer on {component.address()}; "
            "stop it with `eosink stack down` and run `eosink stack up` again"
        )
    component.pid_file.unlink(missing_ok=True)
    component.run_offset = proc.mark_log(component.log_path, f"starting {name}")
    component.prepare(report)
    for env_var, number in component.ports().items():
        if proc.port_in_use(HOST, number):
            raise component.fail(
                f"port {number} for {name} is in use by another process; stop that process "
                f"or pick a free port with {env_var}=<port>"
            )
    started = time.monotonic()
    pid = component.launch()
    proc.write_pid(component.pid_file, pid)
    try:
        _await_ready(component, pid)
    except BaseException:
        component.terminate(pid)
        component.pid_file.unlink(missing_ok=True)
        raise
    report(f"{name}: started (pid {pid}), ready in {time.monotonic() - started:.1f}s")


def _await_ready(component: Component, pid: int) -> None:
    """Poll the probe until it passes, the process dies, or the component's timeout runs out."""
    deadline = time.monotonic() + component.ready_timeout_s
    while True:
        if not proc.alive(pid):
            code = proc.exit_code(pid)
            raise component.fail(f"the server exited{'' if code is None else f' with code {code}'} before it was ready")
        try:
            component.probe()
            break
        except Exception as e:  # noqa: BLE001 - any failure means "not ready yet"
            last = e
        if time.monotonic() >= deadline:
            raise component.fail(
                f"not ready on {component.address()} after {component.ready_timeout_s:.0f}s "
                f"(last probe: {type(last).__name__}: {last})"
            )
        time.sleep(0.25)
    component.verify()


def _answers(component: Component) -> bool:
    try:
        component.probe()
    except Exception:  # noqa: BLE001 - any failure means "not answering"
        return False
    return True


def _answers_within(component: Component, seconds: float) -> bool:
    """A running server may miss one probe (GC pause, busy disk); keep asking for a while."""
    deadline = time.monotonic() + seconds
    while not _answers(component):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def _stop(component: Component, report: Report) -> None:
    pid = component.running_pid()
    if pid is None:
        report(f"{component.name}: not running")
    else:
        survivors = component.terminate(pid)
        if survivors:
            raise ComponentError(component.name, f"pids {sorted(survivors)} survived SIGKILL", component.log_path)
        report(f"{component.name}: stopped (pid {pid})")
    component.pid_file.unlink(missing_ok=True)


def _status(component: Component) -> ComponentStatus:
    pid = component.running_pid()
    state = "stopped" if pid is None else ("running" if _answers(component) else "unhealthy")
    return ComponentStatus(component.name, state, pid, component.address(), component.endpoint(), component.log_path)
