"""The verdict line under the TUI's header: the latest answer to "do my copies slow my
collectives, by how much, and when".

Three sources, best first: a finished A/B experiment (with its 95 % interval); a running one
(its progress and the estimate so far); otherwise the two newest settings epochs compared
directly, marked as such (epochs ran at different times: drift is not cancelled and there is
no interval). Plain Python: the model computes :class:`EpochComparison`, the view only draws
the text of :func:`verdict_text`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from tui.model.ab_stats import pct
from tui.model.overlap_live import RankOverlap
from tui.model.stats import RunAggregate
from workers.wire.overlap import CLASSES
from workers.wire.protocol import MODES

#: Least collectives per epoch before two epochs are compared.
MIN_RECORDS = 20


@dataclass(frozen=True)
class EpochComparison:
    """Two adjacent epochs, all ranks pooled: ``other`` against ``base`` (the epoch in mode
    none when one of them is, else the older one)."""

    base_epoch: int
    other_epoch: int
    base_mode: str
    other_mode: str
    base_p50_ms: float
    other_p50_ms: float
    #: p50 (ms) of ``other``'s collectives per overlap class
    class_p50_ms: dict[str, float] = field(default_factory=dict)
    copy_gbps: float = math.nan  # copies of ``other``

    @property
    def ratio(self) -> float:
        return self.other_p50_ms / self.base_p50_ms if self.base_p50_ms > 0 else math.nan


def _mode_name(index: int | None) -> str:
    return MODES[index] if index is not None and 0 <= index < len(MODES) else "?"


def compare_epochs(overlaps: Iterable[RankOverlap], copies: Iterable[dict[str, np.ndarray]]) -> EpochComparison | None:
    """The two newest epochs with enough settled collectives, compared (None: fewer than two)."""
    overlaps = list(overlaps)
    for ov in overlaps:
        ov.settle()
    epochs = sorted({e for ov in overlaps for e in ov.by_epoch})
    merged: dict[int, list[RunAggregate]] = {}
    for e in reversed(epochs):
        aggs = [RunAggregate() for _ in CLASSES]
        for ov in overlaps:
            for total, part in zip(aggs, ov.by_epoch.get(e, ()), strict=False):
                total.merge(part)
        if sum(a.count for a in aggs) >= MIN_RECORDS:
            merged[e] = aggs
        if len(merged) == 2:
            break
    if len(merged) < 2:
        return None
    new, old = sorted(merged, reverse=True)
    mode_of = {e: m for ov in overlaps for e, m in ov.epoch_mode.items()}
    base, other = old, new
    if _mode_name(mode_of.get(new)) == "none" and _mode_name(mode_of.get(old)) != "none":
        base, other = new, old  # copies are what is judged: compare against the epoch without

    def p50(aggs: list[RunAggregate]) -> float:
        total = RunAggregate()
        for a in aggs:
            total.merge(a)
        return total.stats().p50_ms

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
    )


def epochs_text(c: EpochComparison, peak: LinkPeak | None = None) -> str:
    """ "overlap vs none: p50 +1.6 % · during copies +1.9 % · ...  (adjacent epochs 4, 5: not an A/B ...)"."""
    parts = [
        f"{c.other_mode} vs {c.base_mode}: p50 {pct(c.ratio)} %"
        if c.other_mode != c.base_mode
        else f"epoch {c.other_epoch} vs {c.base_epoch} ({c.other_mode}): p50 {pct(c.ratio)} %"
    ]
    for name, short in ((CLASSES[1], "during copies"), (CLASSES[2], "after")):
        v = c.class_p50_ms.get(name, math.nan)
        if math.isfinite(v) and c.base_p50_ms > 0:
            parts.append(f"{short} {pct(v / c.base_p50_ms)} %")
    if math.isfinite(c.copy_gbps):
        share = peak.share(c.copy_gbps) if peak is not None else ""
        parts.append(f"copies {c.copy_gbps:.1f} GB/s" + (f" = {share}" if share else ""))
    epochs = sorted((c.base_epoch, c.other_epoch))
    return " · ".join(parts) + f"  (adjacent epochs {epochs[0]}, {epochs[1]}: not an A/B, no interval · a: run one)"


def verdict_text(progress: object | None, comparison: EpochComparison | None, peak: LinkPeak | None = None) -> str:
    """The line to show: an experiment's (tui.model.ab_experiment.Progress) or the epochs'."""
    if progress is not None:
        state = getattr(progress, "state", "")
        latest = getattr(progress, "latest", None)
        share = peak.share(latest.copy_gbps[1]) if peak is not None and latest is not None else ""
        if state == "done" and latest is not None:
            return "A/B " + latest.verdict(share)
        if state == "failed":
            return f"A/B failed: {getattr(progress, 'note', '')}"
        head = (
            f"A/B running: {getattr(progress, 'blocks', 0)} blocks, {getattr(progress, 'pairs', 0)} pairs, "
            f"{getattr(progress, 'elapsed_s', 0.0):.0f}/{getattr(progress, 'duration_s', 0.0):.0f} s"
        )
        if latest is not None:
            return f"{head} · so far {latest.verdict(share)}"
        return head + (f" · {getattr(progress, 'note', '')}" if getattr(progress, "note", "") else "")
    if comparison is not None:
        return epochs_text(comparison, peak)
    return "verdict: waiting for two settings epochs (switch with o / 1-4) · a: A/B experiment"


@dataclass(frozen=True)
class LinkPeak:
    """The PCIe link copies cross, from the node telemetry (NVML gen x width: theoretical)."""

    gbps: float
    label: str  # "PCIe Gen5 x16"

    def share(self, gbps: float) -> str:
        """ "87 % of PCIe Gen5 x16 (theoretical 63.0 GB/s)", or "" when unknown."""
        if not (math.isfinite(gbps) and self.gbps > 0):
            return ""
        return f"{gbps / self.gbps * 100:.0f} % of {self.label} (theoretical {self.gbps:.1f} GB/s)"


def pcie_peak(telemetry: object | None) -> LinkPeak | None:
    """The first GPU's PCIe peak in a telemetry snapshot (None without NVML)."""
    for row in getattr(telemetry, "gpus", ()) or ():
        peak = float(getattr(row, "pcie_peak_gbps", math.nan))
        if math.isfinite(peak) and peak > 0:
            return LinkPeak(peak, f"PCIe Gen{row.pcie_gen} x{row.pcie_width}")
    return None
