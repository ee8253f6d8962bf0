"""Node telemetry in the report: every host's ticks as arrays (times, metric[tick, gpu]), and
their means over an epoch's time window, per GPU or over every GPU."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from workers.wire import protocol as p
from workers.wire.telemetry import Tick

#: Tick metrics averaged over an epoch's window: the links, then clocks and power.
TICK_METRICS = (
    *p.LINK_METRICS,
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
)
#: Optional tick metrics the report also reads (NaN in recordings made before them).
HBM_UTIL = "dram_bw_util_pct"


def _nanmean(values: np.ndarray) -> float:
    if values.size == 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(values))


class NodeTelemetry:
    """Node ticks as per-host arrays: times and metric[tick, gpu] matrices, GPUs by uuid."""

    def __init__(self, ticks: Sequence[tuple[int, Tick]]) -> None:
        by_host: dict[str, list[Tick]] = {}
        for _, tick in ticks:
            if tick.uuids:
                by_host.setdefault(tick.host, []).append(tick)
        self.hosts: dict[str, tuple[np.ndarray, tuple[str, ...], dict[str, np.ndarray]]] = {}
        for host, host_ticks in by_host.items():
            uuids = Counter(t.uuids for t in host_ticks).most_common(1)[0][0]
            kept = sorted((t for t in host_ticks if t.uuids == uuids), key=lambda t: t.t_ns)
            mats = {name: np.array([t.metrics[name] for t in kept]) for name in (*TICK_METRICS, HBM_UTIL)}
            self.hosts[host] = (np.array([t.t_ns for t in kept], dtype=np.int64), uuids, mats)

    def mean(self, name: str, t0: int, t1: int, gpu: tuple[str, str] | None) -> float:
        """Mean of ``name`` over ticks in [t0, t1], for one (host, uuid) or every GPU."""
        parts = []
        for host, (times, uuids, mats) in self.hosts.items():
            a, b = np.searchsorted(times, [t0, t1 + 1])
            block = mats[name][a:b]
            if gpu is not None:
                if gpu[0] != host or gpu[1] not in uuids:
                    continue
                block = block[:, uuids.index(gpu[1])]
            parts.append(block.ravel())
        return _nanmean(np.concatenate(parts)) if parts else math.nan


def link_tx(telemetry: NodeTelemetry, t0: int, t1: int) -> float:
    """Link tx GB/s per GPU over [t0, t1]: PCIe, plus NVLink where there is any (A/B results)."""
    pcie = telemetry.mean("pcie_tx_gbps", t0, t1, None)
    nvl = telemetry.mean("nvlink_tx_gbps", t0, t1, None)
    return (0.0 if math.isnan(pcie) else pcie) + nvl if math.isfinite(nvl) and nvl > 0 else pcie


def link_means(telemetry: NodeTelemetry, t0: int, t1: int, gpu: tuple[str, str] | None) -> dict[str, Any]:
    """Each of :data:`TICK_METRICS` averaged over [t0, t1], for one (host, uuid) or every GPU."""
    return {name: telemetry.mean(name, t0, t1, gpu) for name in TICK_METRICS}
