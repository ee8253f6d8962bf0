"""The grid's lines, computed for many ranks at once, against per-cell references: the rows
view's bars (each cell's character and style on each band, the state note over a stopped
rank's tail) and the heat map's cells (one rank per line, or two sharing half blocks)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from frozen_run import frozen_snapshot
from rich.style import Style

from tui.view.widgets.grid_cells import FIXED_W, HEAT_LABEL_W, bucket, visible_top
from tui.view.widgets.grid_lines import Restyle, failed
from tui.view.widgets.heat_map import _HEAT_COLORS, _HEAT_COLORS_DIM, HeatView, _heat_index
from tui.view.widgets.palette import SPARK_CHARS, style
from tui.view.widgets.rank_rows import _spark_bands, _spark_style, state_note
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


def looks_blank(st: Style | None, restyle: Restyle) -> bool:
    """Whether a space in ``st`` looks like one in the line's own style: the same background,
    and nothing a space shows (underline, strike, overline, reverse, a frame)."""
    plain = restyle(_spark_style(0, 0))
    shown = ("underline", "underline2", "strike", "overline", "reverse", "frame", "encircle")
    return (
        st is not None
        and plain is not None
        and st.bgcolor == plain.bgcolor
        and not any(getattr(st, name) for name in shown)
    )


def colour_runs(keys: list[int]) -> int:
    """Runs of one colour in a line of style keys where a blank (0) continues the colour before it."""
    runs, last = 0, None
    for key in keys:
        shown = key if key or last is None else last
        if shown != last:
            runs, last = runs + 1, shown
    return runs


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
                elif key == 0:  # a blank: any style that shows the line's background and nothing else
                    assert ch == " ", (r.state, band, j)
                    assert looks_blank(st, restyle), (r.state, band, j, st)
                else:
                    assert ch == want_ch, (r.state, band, j)
                    assert st == restyle(_spark_style(key, variant)), (r.state, band, j)
            assert all(a.style is not b.style for a, b in zip(segments, segments[1:], strict=False))  # runs merged
            # A blank joins the run before it: a line has a run per change of colour, not per gap.
            assert len(segments) <= colour_runs([k for _, k in want]) + (2 if note else 0), (r.state, band)


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


@pytest.mark.parametrize(("world", "max_lines"), [(8, 40), (9, 6), (64, 40), (65, 30)])
def test_every_heat_cell_matches_the_per_cell_reference(world: int, max_lines: int) -> None:
    snap = frozen_snapshot(world=world, iterations=300)
    ranks = list(snap.ranks)
    ranks[1] = replace(ranks[1], state="stale")
    ranks[2] = replace(ranks[2], state="exited", exit_code=1)
    snap = replace(snap, ranks=tuple(ranks))
    cells = bucket(snap.history, 120, 2)
    top = visible_top(cells)
    restyle = Restyle(Style(bgcolor="#0e1116", color="#d0d0d0"))
    view = HeatView(snap, cells, top, 160, max_lines, restyle)
    step = 2 if (world + 1) // 2 > max_lines - 1 or world > max_lines - 1 else 1
    assert view.step == step and view.per_host == 0
    heat = _heat_index(cells.ms, top)
    assert view.n_lines == 1 + (world + step - 1) // step

    def colors(r: int) -> tuple[str | None, ...]:
        return _HEAT_COLORS_DIM if ranks[r].state in ("stale", "exited") else _HEAT_COLORS

    for line in range(1, view.n_lines):
        up = (line - 1) * step
        down = up + 1 if step == 2 and up + 1 < world else None
        got = [(ch, seg.style) for seg in view.line(line) for ch in seg.text][HEAT_LABEL_W:]
        assert len(got) == 160 - HEAT_LABEL_W
        for j in range(cells.ms.shape[1]):
            up_color = colors(up)[min(int(heat[up, j]) + 1, len(_HEAT_COLORS) - 1)]
            if down is None:
                want = ("█" if up_color else " ", restyle(style(up_color)))
            else:
                down_color = colors(down)[min(int(heat[down, j]) + 1, len(_HEAT_COLORS) - 1)]
                want = ("▀", restyle(style(up_color or "#000000", down_color)))
            assert got[j] == want, (line, j)


def test_rows_view_number_columns_kept_by_what_they_show_draw_what_a_fresh_view_draws() -> None:
    """The rows view keeps each line's number columns by the values they show (they change at
    5 Hz, frames come at 15): a line of unchanged values is the kept one, and every line drawn
    with a warm cache equals the line drawn from scratch, through changes of every kind (state,
    exit, straggler, window and whole-run numbers, counts, classes, width)."""
    from tui.view.widgets.rank_rows import RowsView

    base = frozen_snapshot(world=8, iterations=200)
    ranks = ranks_in_every_state()
    snap = replace(base, ranks=tuple(ranks))
    warm = Restyle(Style(bgcolor="#101010"))

    def lines(s, restyle: Restyle, width: int = 150) -> list[list]:
        view = RowsView(s, bucket(s.history, 60, 1), 15.0, width, row_h=4, restyle=restyle)
        return [view.line(i) for i in range(view.n_lines)]

    copies = replace(snap, ranks=tuple(replace(r) for r in ranks))  # new views, the same values
    assert lines(snap, warm) == lines(copies, warm)
    views = [RowsView(s, bucket(s.history, 60, 1), 15.0, 150, row_h=4, restyle=warm) for s in (snap, copies)]
    for line in range(4):
        kept = views[0]._fixed_columns(snap.ranks[0], line, FIXED_W)
        assert views[1]._fixed_columns(copies.ranks[0], line, FIXED_W) is kept  # kept, not drawn again
    live = ranks[6]
    one_field_each = {
        "state": "stale",
        "host": "other-host",
        "gpu": "3",
        "last_ms": 8.25,
        "p99_ms": 31.5,
        "busbw_gbps": 77.0,
        "copy_gbps": 5.5,
        "run": replace(live.run, p99_ms=42.0),
        "copy_run": replace(live.copy_run, busbw_gbps=3.25),
        "iter_rate": 99.0,
        "count": 12345,
        "missing": 17,
        "drops": 7,
        "run_by_class": {"no copies": live.run_by_class["no copies"]},  # short: the overlapped share fits
        "overlapped": 0.25,
        "copies": 0,
    }
    changes: list[dict[int, dict]] = [{0: {"p50_ms": 9.5}}, {2: {"exit_code": 0}}]
    changes += [{6: {name: value}} for name, value in one_field_each.items()]
    changes += [{6: {"run_by_class": {}}}]
    for change in changes:
        for i, fields in change.items():
            ranks[i] = replace(ranks[i], **fields)
        for s in (replace(snap, ranks=tuple(ranks)), replace(snap, ranks=tuple(ranks), straggler=ranks[3].rank)):
            for width in (150, 90):
                assert lines(s, warm, width) == lines(s, Restyle(Style(bgcolor="#101010")), width)
    assert "9.50" in "".join(seg.text for seg in lines(replace(snap, ranks=tuple(ranks)), warm)[0])


def _with_hosts(snap, hosts: int):  # type: ignore[no-untyped-def]
    """``snap`` with its ranks spread over ``hosts`` hosts, not in rank order (rank r on host
    r % hosts), one failed and one stale rank: hosts whose ranks are not contiguous rows."""
    ranks = [replace(r, host=f"node{r.rank % hosts:02d}.cluster") for r in snap.ranks]
    ranks[5] = replace(ranks[5], state="exited", exit_code=1)
    ranks[6] = replace(ranks[6], state="stale")
    return replace(snap, ranks=tuple(ranks))


def test_a_host_line_shows_the_worst_latency_of_its_ranks_cell_by_cell() -> None:
    """Too many ranks for two a line: one line per host (two hosts a line where even that does
    not fit), each cell the max over the host's ranks, whichever rows they sit on."""
    snap = _with_hosts(frozen_snapshot(world=64, iterations=300), hosts=8)
    cells = bucket(snap.history, 100, 2)
    top = visible_top(cells)
    for max_lines, step in ((10, 1), (6, 2)):
        view = HeatView(snap, cells, top, 160, max_lines)
        assert (view.per_host, view.step) == (8, step)
        by_host = np.stack([np.fmax.reduce(cells.ms[h::8], axis=0) for h in range(8)])
        heat = _heat_index(by_host, top)
        hosts = [(h, None) if step == 1 else (h, h + 1) for h in range(0, 8, step)]
        assert view.n_lines == 1 + len(hosts)
        for line, (up, down) in enumerate(hosts, start=1):
            up_dim = up in (5 % 8, 6 % 8)  # the host of the failed rank 5, of the stale rank 6
            got = [(ch, seg.style) for seg in view.line(line) for ch in seg.text][HEAT_LABEL_W:]
            for j in range(cells.ms.shape[1]):
                up_color = (_HEAT_COLORS_DIM if up_dim else _HEAT_COLORS)[
                    min(int(heat[up, j]) + 1, len(_HEAT_COLORS) - 1)
                ]
                if down is None:
                    assert got[j] == ("█" if up_color else " ", style(up_color)), (max_lines, line, j)
                else:
                    down_dim = down in (5, 6)
                    colors = _HEAT_COLORS_DIM if down_dim else _HEAT_COLORS
                    down_color = colors[min(int(heat[down, j]) + 1, len(_HEAT_COLORS) - 1)]
                    assert got[j] == ("▀", style(up_color or "#000000", down_color)), (max_lines, line, j)


@pytest.mark.parametrize(("world", "hosts", "max_lines"), [(8, 1, 40), (64, 1, 20), (512, 64, 40)])
def test_a_frame_between_text_ticks_reuses_the_rows_and_draws_what_a_fresh_view_draws(
    world: int, hosts: int, max_lines: int
) -> None:
    """Between two text ticks a snapshot keeps the last one's rank views (the same tuple) and
    only its history moves: the heat map keeps the rows it made of them (labels, hosts, dimming)
    and must draw exactly what a view made afresh draws. New rank views, another straggler or
    another height make new rows."""
    snap = _with_hosts(frozen_snapshot(world=world, iterations=300), hosts=hosts)
    restyle = Restyle(Style(bgcolor="#0e1116", color="#d0d0d0"))
    first = HeatView(snap, bucket(snap.history, 120, 2), 2.0, 160, max_lines, restyle)
    later_history = replace(snap.history, ms=snap.history.ms[:, ::-1].copy())  # the cells move
    between = replace(snap, history=later_history)
    cells = bucket(between.history, 120, 2)
    top = visible_top(cells)
    reused = HeatView(between, cells, top, 160, max_lines, restyle, first.layout)
    fresh = HeatView(between, cells, top, 160, max_lines, restyle)
    assert reused.layout is first.layout and fresh.layout is not first.layout
    assert [reused.line(i) for i in range(reused.n_lines)] == [fresh.line(i) for i in range(fresh.n_lines)]
    straggler = replace(between, straggler=3 if between.straggler != 3 else 4)
    new_ranks = replace(between, ranks=tuple(replace(r, state="stale") for r in between.ranks))
    for changed, lines in ((straggler, max_lines), (new_ranks, max_lines), (between, max_lines + 7)):
        again = HeatView(changed, cells, top, 160, lines, restyle, first.layout)
        assert again.layout is not first.layout
        made = HeatView(changed, cells, top, 160, lines, restyle)
        assert [again.line(i) for i in range(again.n_lines)] == [made.line(i) for i in range(made.n_lines)]
    stale = HeatView(new_ranks, cells, top, 160, max_lines, restyle, first.layout)
    assert stale.line(1) != reused.line(1)  # the new states show (dimmed cells, a warning label)


def test_a_rank_that_copies_nothing_has_no_overlap_class_line() -> None:
    """ "p50 by class  during -  after -  none 3.38" under every rank of a job that copies
    nothing (the forum loop's classes): the line is blank there, and shown once the rank copies."""
    from tui.view.widgets.rank_rows import RowsView

    snap = frozen_snapshot(world=2, iterations=50)

    def class_line(copies: int) -> str:
        s = replace(snap, ranks=tuple(replace(r, copies=copies) for r in snap.ranks))
        view = RowsView(s, bucket(s.history, 60, 1), 15.0, 150, row_h=4, restyle=Restyle(Style()))
        return "".join(seg.text for seg in view._fixed_columns(s.ranks[0], 3, FIXED_W))

    assert "p50 by class" in class_line(8)
    assert class_line(0).strip() == ""
