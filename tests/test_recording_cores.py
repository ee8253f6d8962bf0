"""tui.recordings.cores: a report's read uses the cores it may run on, within bounds."""

from __future__ import annotations

import os

import pytest

from tui.recordings import cores


@pytest.mark.parametrize(("usable", "threads"), [(1, 1), (2, 2), (3, 3), (8, 8), (16, cores.MAX_THREADS), (192, 8)])
def test_read_threads_follow_the_usable_cores(monkeypatch: pytest.MonkeyPatch, usable: int, threads: int) -> None:
    monkeypatch.setattr(cores, "usable_cores", lambda: usable)
    assert cores.read_threads() == threads


def test_usable_cores_is_the_affinity_mask_where_there_is_one() -> None:
    if hasattr(os, "sched_getaffinity"):
        assert cores.usable_cores() == len(os.sched_getaffinity(0))
    else:
        assert cores.usable_cores() == (os.cpu_count() or 1)
