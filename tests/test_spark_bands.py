"""The rows view's bars, computed for a block of ranks at once, against a per-cell reference:
each cell's character and style on each band, and the state note over a stopped rank's tail."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from frozen_run import frozen_snapshot
from rich.style import Style

from tui.view.widgets.palette import SPARK_CHARS
from tui.view.widgets.rank_rows import Restyle, _spark_bands, _spark_style, failed, state_note
from workers.wire.protocol import MODES


def reference_cell(level: int, mode: int, band: int, bands: int) -> tuple[str, int]:
    """(character, style key) of one cell on one band, cell by cell (what the bars mean)."""
    if level == 0:
        return " ", 0
    clipped = level == 8 * bands + 1
    part = min(8, level - 8 * band)
    if part <= 0:
        return " ", 0
    char = "▲" if clipped and band == bands - 1 else SPARK_CHARS[max(part, 1) - 1]
    slot = min(max(mode, -1), len(MODES)) + 1
    return char, 1 + slot * 2 + int(clipped)


def ranks_in_every_state() -> list:
    """Eight ranks: live, stale, failed, cleanly exited, stalled, waiting, live, live."""
    ranks = list(frozen_snapshot(world=8, iterations=200).ranks)
    ranks[1] = replace(ranks[1], state="stale", silent_s=12.0)
    ranks[2] = replace(ranks[2], state="exited", exit_code=1, exit_reason="SIGSEGV")
    ranks[3] = replace(ranks[3], state="exited", exit_code=0)
    ranks[4] = replace(ranks[4], state="stalled", idle_s=7.0)
    ranks[5] = replace(ranks[5], state="waiting")
    return ranks


@pytest.mark.parametrize("bands", [1, 2, 5])
def test_every_cell_of_a_block_matches_the_per_cell_reference(bands: int) -> None:
    ranks = ranks_in_every_state()
    rng = np.random.default_rng(bands)
    n = 70
    levels = rng.integers(0, 8 * bands + 2, size=(len(ranks), n)).astype(np.int16)
    tails = [30 if i % 2 else 5 for i in range(len(ranks))]  # where a stopped rank's note goes
    for i, tail in enumerate(tails):
        levels[i, n - tail :] = 0
        levels[i, n - tail - 1] = 1
    modes = rng.integers(-1, len(MODES) + 2, size=(len(ranks), n)).astype(np.int16)
    notes = [state_note(r, None) for r in ranks]
    restyle = Restyle(Style(bgcolor="#0e1116", color="#d0d0d0"))
    block = _spark_bands(levels, modes, ranks, notes, bands, restyle)
    assert len(block) == len(ranks)
    for i, r in enumerate(ranks):
        variant = 2 if failed(r) else 1 if r.state in ("stale", "exited") else 0
        assert len(block[i]) == bands
        for band, segments in enumerate(block[i]):
            cells = [(ch, seg.style) for seg in segments for ch in seg.text]
            assert len(cells) == n
            want = [reference_cell(int(levels[i, j]), int(modes[i, j]), band, bands) for j in range(n)]
            note = notes[i] if r.state != "live" and band == bands - 1 else ""
            start = n - tails[i] if len(note) <= tails[i] else n - len(note)  # at the tail if it fits
            for j, ((ch, st), (want_ch, key)) in enumerate(zip(cells, want, strict=True)):
                if note and start <= j < start + len(note):
                    assert ch == note[j - start]
                    assert st is not None and st.bold
                else:
                    assert ch == want_ch, (r.state, band, j)
                    assert st == restyle(_spark_style(key, variant)), (r.state, band, j)
            assert all(a.style is not b.style for a, b in zip(segments, segments[1:], strict=False))  # runs merged


def test_a_block_draws_each_rank_as_it_would_alone() -> None:
    ranks = ranks_in_every_state()
    rng = np.random.default_rng(7)
    levels = rng.integers(0, 18, size=(len(ranks), 90)).astype(np.int16)
    modes = rng.integers(0, len(MODES), size=(len(ranks), 90)).astype(np.int16)
    notes = [state_note(r, None) for r in ranks]
    block = _spark_bands(levels, modes, ranks, notes, 2, Restyle())
    for i, r in enumerate(ranks):
        alone = _spark_bands(levels[i : i + 1], modes[i : i + 1], [r], [notes[i]], 2, Restyle())
        assert block[i] == alone[0]
