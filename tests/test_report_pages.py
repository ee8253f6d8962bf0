"""tui.recordings.pages: the report's one-shot read changes how memory is handled, never what
is computed, and leaves the process as it found it."""

from __future__ import annotations

import gc
import resource

import numpy as np
import pytest

from tui.recordings.pages import _glibc, collector_paused, heap_kept, small_pages


def test_collector_paused_turns_collection_off_and_back_on() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collector_paused_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collector_paused_restores_after_an_error() -> None:
    try:
        with collector_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()


def test_small_pages_computes_the_same_values() -> None:
    values = np.arange(2_000_000, dtype=np.float32)[::-1]
    outside = np.sort(values)
    with small_pages(), collector_paused():
        inside = np.sort(values)
    assert np.array_equal(inside, outside)


def _faults_of_a_second_big_array(mb: int = 96) -> int:
    """Minor page faults taken to fill a big array after one of the same size was freed."""
    first = np.ones(mb << 18, dtype=np.float32)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = np.ones(mb << 18, dtype=np.float32)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del second
    return faults


@pytest.mark.e2e
def test_heap_kept_reuses_the_pages_of_freed_arrays() -> None:
    """Outside the block glibc maps every big array afresh (a fault per 4 KiB page: ~24,500 for
    96 MB); inside it the second array reuses the first one's pages. (commtop's nodes and CI
    run glibc; elsewhere heap_kept is a no-op and this fails, saying so.)"""
    assert _glibc() is not None, "no glibc here: heap_kept does nothing on this platform"
    with small_pages():
        fresh = _faults_of_a_second_big_array()
        with heap_kept():
            reused = _faults_of_a_second_big_array()
        again = _faults_of_a_second_big_array()
    assert fresh > 20_000
    assert reused < fresh / 10
    assert again > 20_000  # glibc's defaults are back after the block


@pytest.mark.e2e
def test_heap_kept_computes_the_same_values() -> None:
    values = np.random.default_rng(1).random(3_000_000).astype(np.float32)
    with heap_kept():
        inside = np.sort(values)
    assert np.array_equal(inside, np.sort(values))
