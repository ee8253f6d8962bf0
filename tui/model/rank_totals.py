"""The header's numbers over a run's ranks: the medians of their rates and the sums of what they
lost (tui.model.snapshot_builder puts them in every full snapshot)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tui.model.rank_state import RankState
from tui.model.snapshot import RankView
from workers.wire.stats import median


@dataclass(frozen=True)
class RankTotals:
    """The header's numbers: medians of the ranks' rates (from their views, which may be a few
    snapshots old in large worlds) and sums of their losses (from their states: always new)."""

    iter_rate: float
    step_rate: float
    drops: int
    lost: int
    lost_batches: int

    @classmethod
    def of(cls, ranks: tuple[RankView, ...], states: Iterable[RankState], now: int | None = None) -> RankTotals:
        """``now``: the live view's instant (gaps count once settled); None: every gap (the end)."""
        rates = [v.iter_rate for v in ranks if math.isfinite(v.iter_rate)]
        step_rates = [v.step_rate for v in ranks if math.isfinite(v.step_rate)]
        drops = lost = lost_batches = 0
        for s in states:  # as each RankView has them (their settled gaps: RankState.settled_gaps)
            drops += max(s.dropped, s.gaps if now is None else s.settled_gaps(now))
            lost += s.lost
            lost_batches += s.lost_batches
        return cls(
            iter_rate=median(rates) if rates else math.nan,
            step_rate=median(step_rates) if step_rates else math.nan,
            drops=drops,
            lost=lost,
            lost_batches=lost_batches,
        )
