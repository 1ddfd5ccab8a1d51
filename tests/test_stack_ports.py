"""Ports for servers the project starts itself, and what a server that failed to start tells the user."""

from __future__ import annotations

import socket
from pathlib import Path

from eosink.worker.stack import proc


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_free_ports_never_come_from_the_range_outgoing_connections_are_given() -> None:
    # A port from bind(0) is an ephemeral one: a broker's own peer connection can be handed it
    # while the broker still starts, and the broker dies with "Address already in use".
    low = _ephemeral_low()
    for _ in range(200):
        base = proc.free_port_block(7)
        assert base >= proc.FREE_PORT_FLOOR and base + 7 <= low


def test_a_port_block_skips_a_port_someone_listens_on() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", proc.free_port()))
        squatter.listen()
        held = squatter.getsockname()[1]
        for _ in range(300):
            base = proc.free_port_block(5)
            assert not base <= held < base + 5
            with socket.socket() as s:  # and the block is really free (for a server: SO_REUSEADDR, so
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT left there is fine)
                s.bind(("127.0.0.1", base))


def test_failed_server_message_shows_the_cause_logged_above_the_shutdown_noise(tmp_path: Path) -> None:
    log = tmp_path / "kafka-2.log"
    start = proc.mark_log(log, "start")
    noise = [f"[2026-11-27 09:05:28,{i:03d}] INFO shutting down part {i}" for i in range(300)]
    log.write_text(log.read_text() + "\n".join([
        "[2026-11-27 09:05:26,000] INFO starting",
        "[2026-11-27 09:05:27,545] ERROR Unable to start acceptor for PLAINTEXT (kafka.network.DataPlaneAcceptor)",
        "org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:38924: Address already in use.",
        *noise]) + "\n")
    text = proc.log_tail(log, start)
    assert "Address already in use" in text.splitlines()[1]
    assert text.splitlines()[-1] == noise[-1]
    assert len(text.splitlines()) == 20 + 4


def test_a_clean_tail_is_shown_as_it_is(tmp_path: Path) -> None:
    log = tmp_path / "pg.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert proc.log_tail(log) == "\n".join(f"line {i}" for i in range(30, 50))
