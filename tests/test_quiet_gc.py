"""sim.quiet_gc: the collector's settings are restored after a run, even one that raises."""

from __future__ import annotations

import gc

import pytest

from longroute.sim.quiet_gc import YOUNG_THRESHOLD, quiet_gc


def test_quiet_gc_raises_the_young_threshold_and_freezes_then_restores() -> None:
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    with quiet_gc():
        assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()  # the collector still runs, only rarely
    assert gc.get_threshold() == before
    assert (gc.get_freeze_count() > 0) == (frozen_before > 0)


def test_quiet_gc_leaves_an_earlier_freeze_frozen() -> None:
    gc.freeze()
    try:
        with quiet_gc():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_quiet_gc_restores_on_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), quiet_gc():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before
