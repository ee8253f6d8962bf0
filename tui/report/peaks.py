"""How close to the hardware: copy GB/s as a share of the PCIe link's theoretical peak, and
collective busbw as a share of the NVLink peak where there is NVLink.

Peaks come from the node telemetry in the recording (NVML: PCIe generation x width, NVLink
links x per-link speed). A PCIe link downshifts when idle, so the largest peak seen during the
run is the link's. These are theoretical numbers (no protocol overhead): a pinned D2H copy
reaches ~87 % of PCIe Gen5 x16's 63 GB/s."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Peaks:
    pcie_gbps: float = math.nan  # per direction, per GPU
    nvlink_gbps: float = math.nan  # NaN: no NVLink (or no telemetry)

    def copy_share(self, gbps: float) -> str:
        """ "87 % of PCIe (theoretical 63.0 GB/s)", or ""."""
        if not (math.isfinite(gbps) and self.pcie_gbps > 0):
            return ""
        return f"{gbps / self.pcie_gbps * 100:.0f} % of PCIe (theoretical {self.pcie_gbps:.1f} GB/s)"


def _largest(arrays: Sequence[np.ndarray]) -> float:
    vals = [float(np.nanmax(a)) for a in arrays if len(a) and np.isfinite(a).any()]
    return max(vals) if vals else math.nan


def link_peaks(ticks: Sequence[tuple[int, Any]]) -> Peaks:
    """The largest PCIe and NVLink peaks any GPU reported during the recording."""
    return Peaks(
        pcie_gbps=_largest([t.pcie_peak_gbps for _, t in ticks]),
        nvlink_gbps=_largest([t.nvlink_peak_gbps for _, t in ticks]),
    )


def peak_fields(copy_gbps: float, busbw_gbps: float, peaks: Peaks) -> dict[str, Any]:
    """Per report row: copy GB/s in % of the PCIe peak, busbw in % of the NVLink peak."""
    return {
        "copy_pct_pcie": copy_gbps / peaks.pcie_gbps * 100 if peaks.pcie_gbps > 0 else math.nan,
        "busbw_pct_nvlink": busbw_gbps / peaks.nvlink_gbps * 100 if peaks.nvlink_gbps > 0 else math.nan,
    }


def peaks_line(peaks: Peaks) -> str:
    pcie = f"PCIe {peaks.pcie_gbps:.1f} GB/s per direction" if math.isfinite(peaks.pcie_gbps) else "PCIe n/a"
    nvl = f"NVLink {peaks.nvlink_gbps:.0f} GB/s" if math.isfinite(peaks.nvlink_gbps) else "no NVLink"
    return f"link peaks (theoretical, from NVML): {pcie}; {nvl} (json/csv: copy_pct_pcie, busbw_pct_nvlink)"
