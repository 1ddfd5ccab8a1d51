"""A full disk under load: the filesystem sink's volume, and the worker's own home directory.

A small tmpfs is mounted for the test (root only: elsewhere the tests skip, saying why) while a
transactional producer publishes the whole time (every 4th transaction aborted) and real workers
deliver into PostgreSQL and files. The end is counted from the sinks: every committed id once,
none from an aborted transaction, no prepared transaction left. The volume test prints a
``DISK-FIGURES`` line (stall, catch-up, what ``/status`` said): the numbers in docs/faults.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.diskkit import Filler, Volume, files_open_for_writing, tmpfs
from tests.faultkit import Publisher, Rig
from tests.procs import wait_until

pytestmark = pytest.mark.faults


def _retrying(rig: Rig) -> list[str]:
    """What every live worker's ``/status`` shows as being retried now (``retrying`` of each task)."""
    rig.record_statuses()
    shown = []
    for _, _, status in rig.statuses[-len(rig.workers):]:
        if isinstance(status, dict):
            shown += [t["retrying"] for t in status.get("tasks", []) if t.get("retrying")]
    return shown


def _failed(rig: Rig) -> list[Any]:
    return [t for _, _, s in rig.statuses if isinstance(s, dict) for t in s.get("tasks", []) if t.get("state") == "FAILED"]


def _deliver_then_fill(rigs: list[Rig], stack: Any, unique: str, tmp_path: Path, volume: Volume) -> tuple[Rig, Publisher, Filler]:
    """Two workers deliver into PostgreSQL and files on ``volume`` under a producer; then the volume fills."""
    rig = Rig(kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
              tmp=tmp_path, name=unique)
    rigs.append(rig)
    for wid in ("w1", "w2"):
        rig.start(wid)
    rig.wait_running({"w1", "w2"})
    publisher = Publisher(stack.kafka_bootstrap, rig.topic)
    rig.sample_forever()
    publisher.start()
    wait_until(lambda: rig.rows() >= 1000, 120, "the first 1000 rows before the disk fills", interval=0.5)
    return rig, publisher, Filler(volume.path).fill()


def _watch_disk_full(rig: Rig, seconds: float) -> list[str]:
    """Wait for a /status naming the full disk, then keep reading it for ``seconds``: what it showed."""
    shown: list[str] = []

    def disk_full_shown() -> bool:
        shown.extend(s for s in _retrying(rig) if "disk full" in s)
        return bool(shown)

    wait_until(disk_full_shown, 60, "a /status naming the full disk", interval=1.0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # the disk stays full: cycles keep aborting, nothing fails
        shown += [s for s in _retrying(rig) if "disk full" in s]
        time.sleep(1.0)
    assert _failed(rig) == [], f"a task failed on a full disk: {_failed(rig)}"
    return shown


def _free_then_count(rig: Rig, volume: Volume, filler: Filler, publisher: Publisher) -> tuple[float, int]:
    """Grow the volume and remove the filler; delivery resumes by itself; every id counted once.
    Returns when space returned and how many records were committed by then."""
    rows_while_full = rig.rows()
    filler.stop()
    volume.grow("64m")  # the operator grows the volume and removes what filled it
    filler.release()
    freed_at, target = time.monotonic(), len(publisher.committed)
    wait_until(lambda: rig.rows() > rows_while_full and not [s for s in _retrying(rig) if "disk full" in s],
               120, "delivery to resume and /status to clear once space returned", interval=0.5)
    time.sleep(4)  # publishing goes on after the fault
    publisher.stop()
    rig.wait_delivered(publisher.committed)
    rig.assert_exactly_once(publisher.committed, publisher.aborted)
    assert _failed(rig) == []
    return freed_at, target


def _left_prepared(rig: Rig) -> list[str]:
    return sorted(p.name for p in (rig.out / rig.connector / "prepared").iterdir())


def test_filesystem_volume_full_is_retryable_names_the_path_and_loses_nothing(rigs, stack, unique, tmp_path):
    with tmpfs(tmp_path / "out", "2m") as volume:  # the Rig's filesystem sink writes under tmp/out
        rig, publisher, filler = _deliver_then_fill(rigs, stack, unique, tmp_path, volume)
        full_at = time.monotonic()
        shown = _watch_disk_full(rig, 6)
        cli = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "connectors", "--url", rig.workers["w1"].url,
                              "status", rig.connector], capture_output=True, text=True, timeout=60)
        assert "RETRYING [filesystem]" in cli.stdout and "disk full" in cli.stdout, f"the CLI status: {cli.stdout}{cli.stderr}"
        assert all(w.proc.poll() is None for w in rig.workers.values()), "a worker died on a full disk"
        assert any(str(volume.path / rig.connector) in s for s in shown), f"/status does not name the volume: {shown[:3]}"
        freed_at, target = _free_then_count(rig, volume, filler, publisher)
        assert _left_prepared(rig) == [], "a half-written or prepared file is left"
        figures = {
            "fault": "filesystem sink volume full (2 MiB tmpfs, kept full)", "records": len(publisher.committed),
            "aborted": len(publisher.aborted), "full_s": round(freed_at - full_at, 1),
            "longest_stall_s": round(rig.stall(full_at, freed_at + 60), 1),
            "catch_up_after_space_returned_s": round(rig.catch_up(freed_at, target), 1),
            "status": sorted({s.split(" (retrying for")[0][:260] for s in shown})[:2],
            "log": rig.log_lines("w1", "disk full")[:1],
        }
        print("DISK-FIGURES " + json.dumps(figures))
        rig.stop()  # before the volume goes


def test_worker_killed_while_the_volume_is_full_leaves_its_partitions_to_one_that_delivers_everything_once(
        rigs, stack, unique, tmp_path):
    """kill -9 of a worker whose cycles keep failing on the full volume: the other takes its partitions
    and recovers them on the full disk (recovery writes nothing), then delivers everything once space returns."""
    with tmpfs(tmp_path / "out", "2m") as volume:
        rig, publisher, filler = _deliver_then_fill(rigs, stack, unique, tmp_path, volume)
        _watch_disk_full(rig, 1)
        rig.workers["w1"].signal(signal.SIGKILL)
        rig.workers["w1"].wait(10)
        rig.wait_running({"w2"})  # all six partitions, acquired and recovered with the disk still full
        shown = _watch_disk_full(rig, 2)
        assert rig.workers["w2"].proc.poll() is None, "the surviving worker died on a full disk"
        _free_then_count(rig, volume, filler, publisher)
        # A write the kill cut short may leave its temporary file (recovery removes it once it is
        # 15 minutes old): nothing else, and only the killed worker's.
        left = _left_prepared(rig)
        assert all(name.endswith(".tmp") and ".w1." in name for name in left), f"left in prepared/: {left}"
        print(f"KILLED-WHILE-FULL {len(publisher.committed)} records once; status {shown[-1][:200]}; left {left}")
        rig.stop()


def test_worker_home_on_a_full_volume_delivers_exactly_once_because_the_worker_writes_nothing_there(
        rigs, stack, unique, tmp_path):
    """The worker's own directories (EOSINK_HOME, the working directory, HOME, TMPDIR: the image's
    /var/lib/eosink and /tmp) on a volume with no byte free: the worker keeps no local state (its
    logs go to stdout, offsets and status to ZooKeeper), so delivery goes on as if nothing were wrong."""
    with tmpfs(tmp_path / "home", "1m") as volume:
        filler = Filler(volume.path).fill()
        try:
            rig = Rig(kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
                      tmp=tmp_path, name=unique, files=False)
            rigs.append(rig)
            home = str(volume.path)
            worker = rig.start("w1", cwd=volume.path, extra_env={"EOSINK_HOME": home, "HOME": home, "TMPDIR": home})
            rig.wait_running({"w1"})
            publisher = Publisher(stack.kafka_bootstrap, rig.topic)
            publisher.start()
            wait_until(lambda: rig.rows() >= 1000, 120, "delivery with the worker's home full", interval=0.5)
            writing = files_open_for_writing(worker.proc.pid)
            time.sleep(3)
            publisher.stop()
            rig.wait_delivered(publisher.committed)
            rig.assert_exactly_once(publisher.committed, publisher.aborted)
            assert _retrying(rig) == [] and _failed(rig) == []
            assert writing == {str(worker.log_path)}, f"the worker writes files other than its stdout: {writing}"
            assert worker.stop() == 0, "the worker did not stop cleanly with its home full"
            assert sorted(os.listdir(volume.path)) == ["filler"], "the worker wrote into its full home"
            assert volume.free_bytes() < 4096
            rig.stop()
        finally:
            filler.release()
