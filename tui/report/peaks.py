"""How close to the hardware: copy GB/s as a share of the PCIe link's theoretical peak, and
collective busbw as a share of the NVLink peak where there is NVLink, or of a measured peak.

Peaks come from the node telemetry in the recording (NVML: PCIe generation x width, NVLink
links x per-link speed). A PCIe link downshifts when idle, so the largest peak seen during the
run is the link's; its generation and width come from the node's capability messages
(TELEM_CAPS) recorded beside the ticks ("unknown" in a recording without them). These are
theoretical numbers (no protocol overhead): a pinned D2H copy reaches ~87 % of PCIe Gen5 x16's
63 GB/s. With `commtop report --peak FILE` (nccl-tests ``-J`` output, tui.report.nccl_tests)
each row's busbw is also given as a share of the busbw nccl-tests measured for that op and size."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tui.report.nccl_tests import MeasuredPeaks, size_text
from workers.wire import protocol as p
from workers.wire.telemetry import decode_caps


@dataclass(frozen=True)
class Peaks:
    pcie_gbps: float = math.nan  # per direction, per GPU
    nvlink_gbps: float = math.nan  # NaN: no NVLink (or no telemetry)
    pcie_gen: int = -1  # of the link at its peak; -1: unknown (no capability message recorded)
    pcie_width: int = -1
    measured: tuple[MeasuredPeaks, ...] = ()  # `--peak FILE`, one per op

    @property
    def pcie_label(self) -> str:
        """ "PCIe Gen5 x16" (as the live verdict says it), or "PCIe (generation and width unknown)"."""
        if self.pcie_gen > 0 and self.pcie_width > 0:
            return f"PCIe Gen{self.pcie_gen} x{self.pcie_width}"
        return "PCIe (generation and width unknown)"

    def copy_share(self, gbps: float) -> str:
        """ "87 % of PCIe Gen5 x16 (theoretical 63.0 GB/s)", or ""."""
        if not (math.isfinite(gbps) and self.pcie_gbps > 0):
            return ""
        return f"{gbps / self.pcie_gbps * 100:.0f} % of {self.pcie_label} (theoretical {self.pcie_gbps:.1f} GB/s)"

    def measured_for(self, op: str) -> MeasuredPeaks | None:
        return next((m for m in self.measured if m.op == op), None)


def _largest(arrays: Sequence[np.ndarray]) -> float:
    vals = [float(np.nanmax(a)) for a in arrays if len(a) and np.isfinite(a).any()]
    return max(vals) if vals else math.nan


def pcie_link(caps: Sequence[Any]) -> tuple[int, int]:
    """(generation, width) of the fastest PCIe link in the recorded TELEM_CAPS messages (each
    GPU's current link; an idle link downshifts, so the fastest seen is the link's), or (-1, -1)."""
    best = (-1.0, -1, -1)
    for msg in caps:
        if not isinstance(msg, dict) or msg.get("k") != p.TELEM_CAPS:
            continue
        try:
            gpus = decode_caps(msg).gpus
        except p.ProtocolError:
            continue
        for g in gpus:
            if g.pcie_gen > 0 and g.pcie_width > 0 and math.isfinite(g.pcie_peak_gbps) and g.pcie_peak_gbps > best[0]:
                best = (g.pcie_peak_gbps, g.pcie_gen, g.pcie_width)
    return best[1], best[2]


def link_peaks(
    ticks: Sequence[tuple[int, Any]], caps: Sequence[Any] = (), measured: Sequence[MeasuredPeaks] = ()
) -> Peaks:
    """The largest PCIe and NVLink peaks any GPU reported during the recording (``caps``: the
    recorded TELEM_CAPS messages, for the PCIe generation and width), and measured peaks."""
    gen, width = pcie_link(caps)
    return Peaks(
        pcie_gbps=_largest([t.pcie_peak_gbps for _, t in ticks]),
        nvlink_gbps=_largest([t.nvlink_peak_gbps for _, t in ticks]),
        pcie_gen=gen,
        pcie_width=width,
        measured=tuple(measured),
    )


def peak_fields(copy_gbps: float, busbw_gbps: float, peaks: Peaks, op: str = "", nbytes: int = 0) -> dict[str, Any]:
    """Per report row: copy GB/s in % of the PCIe peak, busbw in % of the NVLink peak, and in %
    of the busbw nccl-tests measured for the row's op and size (the nearest size measured)."""
    measured = peaks.measured_for(op)
    peak = measured.lookup(nbytes)[0] if measured is not None else math.nan
    return {
        "copy_pct_pcie": copy_gbps / peaks.pcie_gbps * 100 if peaks.pcie_gbps > 0 else math.nan,
        "busbw_pct_nvlink": busbw_gbps / peaks.nvlink_gbps * 100 if peaks.nvlink_gbps > 0 else math.nan,
        "busbw_pct_measured": busbw_gbps / peak * 100 if peak > 0 else math.nan,
    }


def peaks_line(peaks: Peaks) -> str:
    pcie = (
        f"{peaks.pcie_label} {peaks.pcie_gbps:.1f} GB/s per direction" if math.isfinite(peaks.pcie_gbps) else "PCIe n/a"
    )
    nvl = f"NVLink {peaks.nvlink_gbps:.0f} GB/s" if math.isfinite(peaks.nvlink_gbps) else "no NVLink"
    return f"link peaks (theoretical, from NVML): {pcie}; {nvl} (json/csv: copy_pct_pcie, busbw_pct_nvlink)"


def measured_lines(peaks: Peaks, rows: Sequence[Any]) -> list[str]:
    """With --peak: where each measured op's peak came from, and each (op, size) of the run's
    all-ranks rows as a share of it (count-weighted mean busbw)."""
    lines = []
    for m in peaks.measured:
        best, at = m.best()
        lines.append(
            f"measured peaks ({m.program}, {m.path}): {m.op} busbw up to {best:.1f} GB/s (at {size_text(at)}), "
            f"{len(m.busbw)} sizes (json/csv: busbw_pct_measured)"
        )
        sums: dict[int, tuple[float, int]] = {}
        for r in rows:
            if r.rank is None and r.op == m.op and r.count > 0 and math.isfinite(r.busbw_gbps):
                s, n = sums.get(r.nbytes, (0.0, 0))
                sums[r.nbytes] = (s + r.busbw_gbps * r.count, n + r.count)
        for nbytes, (s, n) in sorted(sums.items()):
            peak, size = m.lookup(nbytes)
            near = "" if size == nbytes else f" (nearest measured size {size_text(size)})"
            lines.append(
                f"  {m.op} {size_text(nbytes)}: busbw {s / n:.1f} GB/s = {s / n / peak * 100:.0f} % of the measured "
                f"{peak:.1f} GB/s{near}"
            )
    return lines


def peaks_json(peaks: Peaks) -> dict[str, Any]:
    """The peaks the report used: theoretical (NVML) and measured (--peak), for scripts."""
    return {
        "pcie_gbps": peaks.pcie_gbps,
        "pcie_gen": peaks.pcie_gen if peaks.pcie_gen > 0 else None,
        "pcie_width": peaks.pcie_width if peaks.pcie_width > 0 else None,
        "nvlink_gbps": peaks.nvlink_gbps,
        "measured": [
            {
                "op": m.op,
                "program": m.program,
                "path": m.path,
                "busbw_gbps": {str(k): v for k, v in sorted(m.busbw.items())},
            }
            for m in peaks.measured
        ],
    }
