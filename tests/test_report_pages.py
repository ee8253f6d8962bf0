"""tui.recordings.pages: the report's one-shot read changes how memory is handled, never what
is computed, and leaves the process as it found it."""

from __future__ import annotations

import gc

import numpy as np

from tui.recordings.pages import collector_paused, small_pages


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
