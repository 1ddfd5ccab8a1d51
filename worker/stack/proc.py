"""Server processes: spawn in their own session, pid files, liveness, tree kill, port checks.

Every server runs in a new session (``start_new_session=True``), so its pid is also its process
group id; stopping a server signals its group and all its descendants, which is how ``down``
leaves nothing behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from eosink.worker.stack.layout import HOST

# Servers started by this Python process, by pid: lets liveness checks reap our own exited
# children (a zombie still has a /proc entry) and report their exit codes.
_children: dict[int, subprocess.Popen[bytes]] = {}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Maven colours its output even in batch mode; error messages should not carry escapes."""
    return _ANSI.sub("", text)


def spawn(argv: Sequence[str], log_path: Path, *, cwd: Path, env: Mapping[str, str] | None = None) -> int:
    """Start a long-running server detached from us; its stdout and stderr append to ``log_path``
    (``env``: the whole environment, default ours)."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    _children[proc.pid] = proc
    return proc.pid


def mark_log(log_path: Path, text: str) -> int:
    """Append a dated banner and return the offset after it, where this run's output starts."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n=== eosink stack {datetime.now().isoformat(timespec='seconds')}: {text} ===\n".encode())
        return log.tell()


_FIRST_ERROR = re.compile(r"\b(ERROR|FATAL|PANIC)\b|Exception:|Error:")


def log_tail(log_path: Path, start: int = 0, lines: int = 20) -> str:
    """The last ``lines`` lines written at or after byte ``start`` (ANSI colours stripped).

    A server that fails often logs its cause early and then pages of orderly shutdown (Kafka's
    "Address already in use" sits ~250 lines above its exit), so the first line of this run that
    reads as an error is put ahead of the tail when the tail does not hold it.
    """
    try:
        with open(log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start, size - 4 * 1024 * 1024))
            text = strip_ansi(f.read().decode(errors="replace"))
    except OSError:
        return ""
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    first = next((i for i, line in enumerate(all_lines) if _FIRST_ERROR.search(line)), None)
    if first is None or first >= len(all_lines) - lines:
        return "\n".join(tail)
    cause = all_lines[first:first + 3]
    return "\n".join([*cause, f"[... {len(all_lines) - lines - first - len(cause)} lines ...]", *tail])


def exit_code(pid: int) -> int | None:
    """The exit code of a server we spawned that has exited, else None."""
    proc = _children.get(pid)
    return proc.poll() if proc is not None else None


def alive(pid: int, workdir: Path | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, if given, its working directory is ``workdir``.

    Each server runs in its own data directory, which is unique per stack and component; the
    check guards against pid reuse: a stale pid file must not make us adopt, or kill, an
    unrelated process that happens to have the same pid now.
    """
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cwd = os.readlink(f"/proc/{pid}/cwd") if workdir is not None else None
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return False
    return workdir is None or Path(cwd or "") == workdir


def _process_table() -> dict[int, tuple[int, int]]:
    """Live (non-zombie) processes: pid -> (parent pid, process group id)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def family(pid: int) -> set[int]:
    """``pid``, its process group, and all their descendants, as far as they are alive.

    The group alone is not enough: PostgreSQL puts every backend in a session of its own.
    """
    table = _process_table()
    members = {p for p, (_, pgid) in table.items() if pgid == pid or p == pid}
    grew = True
    while grew:
        children = {p for p, (ppid, _) in table.items() if ppid in members} - members
        members |= children
        grew = bool(children)
    return members


def kill_tree(pid: int, timeout: float, known: set[int] | None = None) -> set[int]:
    """SIGTERM the server's family, wait up to ``timeout`` for it to exit, then SIGKILL the rest.

    The family is re-read before each signal (to catch late children) and merged with ``known``,
    a snapshot taken earlier by a caller that stopped the server another way (orphans lose
    their parent link when the server dies). Returns the pids that survived SIGKILL.
    """
    targets = family(pid) | (known or set())
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        targets |= family(pid)
        for member in targets:
            try:
                os.kill(member, sig)
                os.kill(member, signal.SIGCONT)  # a SIGSTOPped server (crash tests) must see SIGTERM
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while True:
            exit_code(pid)  # reaps our own child, so it stops looking alive
            targets = {member for member in targets if alive(member)}
            if not targets:
                _children.pop(pid, None)
                return set()
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    return targets


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def write_pid(pid_file: Path, pid: int) -> None:
    """Only the pid, so ``kill -STOP $(cat zookeeper.pid)`` works in crash experiments."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{pid}\n")


def port_in_use(host: str, port: int) -> bool:
    """True if something listens on (or holds) ``host:port``.

    Binds with SO_REUSEADDR, like the servers themselves do, so sockets in TIME_WAIT from a
    previous run do not count as "in use" while a listener does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Where :func:`free_port_block` looks: above the stack's default ports (12181..19193, plus the secure
#: offset) and below the kernel's ephemeral range.
FREE_PORT_FLOOR = 20000


def free_port_block(count: int = 1, host: str = HOST) -> int:
    """The first of ``count`` consecutive ports on ``host`` that nothing holds now.

    Chosen below the kernel's ephemeral range on purpose: a port picked by binding to port 0 comes
    from that range, and while a server takes seconds to start, any outgoing connection on the
    machine (its own peers' included) may be given that very port, and the server then fails with
    "Address already in use". Ports outside the range are only taken by someone binding them.
    """
    high = max(_ephemeral_low(), FREE_PORT_FLOOR + 1000)
    for _ in range(500):
        base = random.randrange(FREE_PORT_FLOOR, high - count)
        if not any(port_in_use(host, p) for p in range(base, base + count)):
            return base
    raise OSError(errno.EADDRINUSE, f"no {count} consecutive free ports on {host} in {FREE_PORT_FLOOR}..{high}")


def free_port(host: str = HOST) -> int:
    """One free port for a server about to start (see :func:`free_port_block`)."""
    return free_port_block(1, host)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock across processes, so two ``up``/``down`` calls on one home take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
