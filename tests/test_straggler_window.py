"""The header's straggler line says what holds the others up *now* (the last few seconds), and
keeps the run's worst arrival skew as a detail beside it (issue 27: a 40.6 ms skew at iteration
222 stayed the headline for minutes, through 9 epochs). The real model, fed synthetic batches
of two ranks; the real header text."""

from __future__ import annotations

import numpy as np
from frozen_run import T0, frozen_coll, frozen_hello

from tui.model.run_model import RunModel
from tui.model.snapshot import Snapshot
from tui.model.snapshot_builder import RECENT_SKEW_S
from tui.view.widgets.header import header_text

PERIOD_NS = 10_000_000  # an iteration every 10 ms (frozen_coll's default)
LATE = {222: 40.6, 2500: 5.0}  # iteration -> ms rank 1 arrives late (rank 0 waits that much longer)


def play(until: int, every: int = 50) -> tuple[RunModel, list[tuple[int, Snapshot]]]:
    """Iterations 0..until-1 in batches of ``every``, a snapshot after each, at the time of the
    newest iteration (as the app sees a live run)."""
    model = RunModel()
    for r in range(2):
        model.apply(frozen_hello(r, 2))
    rng = np.random.default_rng(3)
    snaps = []
    for seq, lo in enumerate(range(0, until, every)):
        its = np.arange(lo, min(lo + every, until))
        base = 2000.0 + rng.normal(0.0, 20.0, len(its))
        wait = np.array([LATE.get(int(i), 0.0) * 1000.0 for i in its])
        model.apply(frozen_coll(0, seq, its, base + wait))  # rank 0 waits for rank 1
        model.apply(frozen_coll(1, seq, its, base))
        now = T0 + int(its[-1]) * PERIOD_NS
        snaps.append((int(its[-1]), model.snapshot(now)))
    return model, snaps


def line(snap: Snapshot) -> str:
    return header_text(snap).plain.split("\n")[1]


def test_the_straggler_line_speaks_of_the_last_seconds_and_keeps_the_worst_as_a_detail() -> None:
    _model, snaps = play(3000)
    by_it = dict(snaps)
    soon = line(by_it[299])  # 0.8 s after the skew
    assert f"⚠ straggler (last {RECENT_SKEW_S:g} s): rank 1 arrived 40.6 ms late at iteration 222" in soon
    assert "run's worst" not in soon  # it is the current one
    quiet = line(by_it[1999])  # 17.8 s after: nobody straggles now
    assert "⚠" not in quiet
    assert "run's worst: rank 1 40.6 ms late at iteration 222" in quiet
    later = line(by_it[2549])  # a smaller straggle now, the worst one long ago
    assert "⚠ straggler (last 10 s): rank 1 arrived 5.0 ms late at iteration 2500" in later
    assert "· run's worst: rank 1 40.6 ms late at iteration 222" in later
    final = snaps[-1][1]
    assert final.worst_skew is not None and final.worst_skew.iteration == 222  # the summary's
    assert final.recent_skew is not None and final.recent_skew.iteration == 2500


def test_the_line_is_the_recent_state_at_every_snapshot() -> None:
    """Through the whole run, the headline names an iteration of the last RECENT_SKEW_S."""
    _model, snaps = play(3000)
    for newest, snap in snaps:
        e = snap.recent_skew
        if e is not None and e.headline:
            assert (newest - e.iteration) * PERIOD_NS <= RECENT_SKEW_S * 1e9, (newest, e)
            assert f"at iteration {e.iteration}" in line(snap)
        else:
            assert "⚠" not in line(snap)
