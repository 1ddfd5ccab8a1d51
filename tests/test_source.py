"""The record source's process-wide pieces that need no broker: the garbage-collector pause."""

from __future__ import annotations

import gc

import pytest

from eosink.worker.engine import source


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_gc_pause_is_counted_so_the_collector_comes_back_only_after_the_last_holder(collector_on):
    source._pause_gc()
    source._pause_gc()
    assert not gc.isenabled()
    source._resume_gc()
    assert not gc.isenabled()
    source._resume_gc()
    assert gc.isenabled()


def test_overlapping_gc_pauses_still_collect_cyclic_garbage(collector_on, monkeypatch):
    """Task threads whose cycles overlap keep the collector paused between them; once it has been
    off longer than GC_MAX_PAUSE_S, the next pause collects, so reference cycles made meanwhile by
    other threads do not pile up for as long as the worker is busy."""
    monkeypatch.setattr(source, "GC_MAX_PAUSE_S", 0.0)
    with source.gc_paused():  # task A's cycle
        for _ in range(500):
            _Cycle()  # garbage with a reference cycle: only the collector frees it
        assert any(isinstance(o, _Cycle) for o in gc.get_objects())
        with source.gc_paused():  # task B's cycle begins before A's ends: one collection first
            assert not any(isinstance(o, _Cycle) for o in gc.get_objects())
            assert not gc.isenabled()
    assert gc.isenabled()
