"""The verdict line under the TUI's header: the latest answer to "do my copies slow my
collectives, by how much, and when".

Three sources, best first: a finished A/B experiment (with its 95 % interval); a running one
(its progress and the estimate so far); otherwise the two newest settings epochs compared
directly, marked as such (epochs ran at different times: drift is not cancelled and there is
no interval). Plain Python: the model computes the epochs' comparison
(:class:`tui.model.epochs.EpochComparison`); this module says it in words, the view draws the text
of :func:`verdict_text`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tui.experiment.ab_stats import pct
from tui.model.changeable import Changeable
from tui.model.epochs import MIN_RECORDS, EpochComparison
from workers.wire.overlap import CLASSES


def epochs_text(c: EpochComparison, peak: LinkPeak | None = None) -> str:
    """ "overlap vs none: p50 +1.6 % · during copies +1.9 % · ...  (epochs 4, 5: not an A/B ...)"."""
    if c.settling:  # the epoch in force (the header's) has too few collectives yet
        return (
            f"{_epoch_name(c.other_epoch, c.other_mode)} vs {_epoch_name(c.base_epoch, c.base_mode)}: "
            f"waiting for {MIN_RECORDS} of its collectives to settle"
        )
    if c.other_mode != c.base_mode:
        what = f"{c.other_mode} vs {c.base_mode}"
    elif c.change:
        what = f"{c.change} ({c.other_mode})"
    else:
        what = f"epoch {c.other_epoch} vs {c.base_epoch} ({c.other_mode})"
    parts = [f"{what}: p50 {pct(c.ratio)} %"]
    for name, short in ((CLASSES[1], "during copies"), (CLASSES[2], "after")):
        v = c.class_p50_ms.get(name, math.nan)
        if math.isfinite(v) and c.base_p50_ms > 0:
            parts.append(f"{short} {pct(v / c.base_p50_ms)} %")
    if math.isfinite(c.copy_gbps):
        share = peak.share(c.copy_gbps) if peak is not None else ""
        parts.append(f"copies {c.copy_gbps:.1f} GB/s" + (f" = {share}" if share else ""))
    epochs = sorted((c.base_epoch, c.other_epoch))
    return " · ".join(parts) + f"  (epochs {epochs[0]}, {epochs[1]}: not an A/B, no interval · a: run one)"


def _epoch_name(epoch: int, mode: str) -> str:
    return f"epoch {epoch}" + (f" ({mode})" if mode != "?" else "")


def verdict_text(
    progress: object | None,
    comparison: EpochComparison | None,
    peak: LinkPeak | None = None,
    idle: str = "",
    can: Changeable | None = None,
) -> str:
    """The line to show: an experiment's (tui.experiment.ab_experiment.Progress) or the epochs';
    ``idle`` when there is neither (a replay's own; default: how to get one live); ``can``: what
    the run can change (a run that can change nothing has no epochs to wait for)."""
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
    if idle:
        return idle
    if can is not None and can.known and not can.names():
        return f"verdict: no settings to compare: this run can change {can.describe()}"
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
