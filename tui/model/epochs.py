"""The newest settings epoch against the newest older one of other settings, all ranks pooled:
the statistics behind the verdict line when no A/B experiment ran (its text is
:mod:`tui.experiment.verdict`'s). Epochs of identical settings are never compared.

Epochs ran at different times, so drift is not cancelled and there is no interval; the
snapshot carries the comparison, the view words it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tui.model.overlap_live import RankOverlap
from tui.model.stats import RunAggregate, pooled_stats
from workers.wire.overlap import CLASSES
from workers.wire.protocol import MODES
from workers.wire.settings import Settings

#: Least collectives per epoch before two epochs are compared.
MIN_RECORDS = 20


@dataclass(frozen=True)
class EpochComparison:
    """Two epochs of different settings, all ranks pooled: ``other`` against ``base`` (the epoch
    in mode none when one of them is, else the older one)."""

    base_epoch: int
    other_epoch: int
    base_mode: str
    other_mode: str
    base_p50_ms: float
    other_p50_ms: float
    #: p50 (ms) of ``other``'s collectives per overlap class
    class_p50_ms: dict[str, float] = field(default_factory=dict)
    copy_gbps: float = math.nan  # copies of ``other``
    #: ``other`` is the epoch in force and has fewer than MIN_RECORDS settled collectives yet:
    #: which epochs will be compared is known, the numbers are not (NaN).
    settling: bool = False
    #: what else differs from ``base`` to ``other`` ("copies 5 → 3"; "" when unknown or only the mode)
    change: str = ""

    @property
    def ratio(self) -> float:
        return self.other_p50_ms / self.base_p50_ms if self.base_p50_ms > 0 else math.nan


def _mode_name(index: int | None) -> str:
    return MODES[index] if index is not None and 0 <= index < len(MODES) else "?"


#: The settings fields a comparison names when they differ (besides the mode).
_FIELDS = ("copies", "copy_scale", "pinned", "direction", "delay_ms", "delay_rank", "delay_on")


def settings_change(base: Settings | None, other: Settings | None) -> str:
    """ "copies 5 → 3 · knob.lr 1e-3 → 1e-4": what differs besides the mode ("" when unknown)."""
    if base is None or other is None:
        return ""
    parts = [f"{f} {getattr(base, f)} → {getattr(other, f)}" for f in _FIELDS if getattr(base, f) != getattr(other, f)]
    names = sorted(set(base.knobs) | set(other.knobs))
    parts += [
        f"knob.{k} {base.knobs.get(k, '-')} → {other.knobs.get(k, '-')}"
        for k in names
        if base.knobs.get(k) != other.knobs.get(k)
    ]
    return " · ".join(parts)


def compare_epochs(
    overlaps: Iterable[RankOverlap],
    copies: Iterable[dict[str, np.ndarray]],
    settings_of: Callable[[int], Settings | None] = lambda epoch: None,
    *,
    newest: int = -1,
) -> EpochComparison | None:
    """The newest epoch with enough settled collectives against the newest older one whose
    settings differ (None: no such pair). ``newest``: the epoch in force (the header's), which
    must be the newer of the two, so the line and the header speak of the same epoch; while it
    has too few settled collectives the comparison is ``settling`` (no numbers). Epochs of
    identical settings (a change that changed nothing, an A/B's blocks of one arm) are never
    compared: where the settings of an epoch are not known (``settings_of``), two epochs differ
    only if their records' modes do."""
    overlaps = list(overlaps)
    for ov in overlaps:
        ov.settle()
    epochs = sorted({e for ov in overlaps for e in ov.by_epoch if newest < 0 or e <= newest})
    mode_of = {e: m for ov in overlaps for e, m in ov.epoch_mode.items()}

    def differs(a: int, b: int) -> bool:
        sa, sb = settings_of(a), settings_of(b)
        if sa is not None and sb is not None:
            return sa != sb
        return _mode_name(mode_of.get(a)) != _mode_name(mode_of.get(b))

    chosen: list[int] = []  # newest first
    young = 0 <= newest and newest not in epochs  # the epoch in force has too few settled collectives
    for e in reversed(epochs):
        ref = chosen[0] if chosen else (newest if young else None)  # what an older epoch must differ from
        if ref is not None and ref != e and not differs(ref, e):
            continue
        if sum(part.count for ov in overlaps for part in ov.by_epoch.get(e, ())) >= MIN_RECORDS:
            chosen.append(e)
        elif e == newest:
            young = True
        if len(chosen) == (1 if young else 2):
            break
    if young and chosen:
        (old,) = chosen
        return EpochComparison(
            base_epoch=old,
            other_epoch=newest,
            base_mode=_mode_name(mode_of.get(old)),
            other_mode=_mode_name(mode_of.get(newest)),
            base_p50_ms=math.nan,
            other_p50_ms=math.nan,
            settling=True,
            change=settings_change(settings_of(old), settings_of(newest)),
        )
    if len(chosen) < 2:
        return None  # one epoch, or none that differ: nothing merged (at 512 ranks, ~1,500 merges saved)
    merged = {e: _pooled(overlaps, e) for e in chosen}
    new, old = sorted(merged, reverse=True)
    base, other = old, new
    if _mode_name(mode_of.get(new)) == "none" and _mode_name(mode_of.get(old)) != "none":
        base, other = new, old  # copies are what is judged: compare against the epoch without

    def p50(aggs: list[RunAggregate]) -> float:
        return pooled_stats(aggs).p50_ms

    classes = {name: agg.stats().p50_ms for name, agg in zip(CLASSES, merged[other], strict=True) if agg.count}
    nbytes = dur = 0.0
    for cols in copies:
        sel = cols["epoch"] == other
        if sel.any():
            nbytes += float(cols["nbytes"][sel].sum())
            dur += float(cols["dur_us"][sel].astype(np.float64).sum())
    return EpochComparison(
        base_epoch=base,
        other_epoch=other,
        base_mode=_mode_name(mode_of.get(base)),
        other_mode=_mode_name(mode_of.get(other)),
        base_p50_ms=p50(merged[base]),
        other_p50_ms=p50(merged[other]),
        class_p50_ms=classes,
        copy_gbps=nbytes / dur / 1e3 if dur > 0 else math.nan,
        change=settings_change(settings_of(base), settings_of(other)),
    )


def _pooled(overlaps: list[RankOverlap], epoch: int) -> list[RunAggregate]:
    """Per overlap class, every rank's collectives of ``epoch`` in one aggregate."""
    aggs = [RunAggregate() for _ in CLASSES]
    for ov in overlaps:
        for total, part in zip(aggs, ov.by_epoch.get(epoch, ()), strict=False):
            total.merge(part)
    return aggs
