"""Pure rate arithmetic for NVML readings: GPM metrics, wrapping counters, peaks, units.

No NVML and no I/O here, so the fixture tests drive exactly the code the sampler runs on
real H200 readings (tests/fixtures/nvml/).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workers.telemetry.nvml import NA

GB = 1e9  # GB/s = 1e9 B/s, as everywhere in commtop (busbw.algbw_gbps)
MIB = 1 << 20
KIB = 1 << 10

# GPM metric ids (nvmlGpmMetricId_t). NVML names 60 RX and 61 TX (nvml.h / pynvml).
GPM_PCIE_TX = 20
GPM_PCIE_RX = 21
GPM_NVLINK_RX = 60
GPM_NVLINK_TX = 61
#: HBM (DRAM) bandwidth used vs its theoretical maximum, 0-100 %: NCCL's maintainers suspect HBM
#: contention, not the links, when copies slow collectives (shared/FACTS.md).
GPM_DRAM_BW_UTIL = 10
GPM_METRICS: Mapping[int, str] = {
    GPM_PCIE_TX: "pcie_tx_gbps",
    GPM_PCIE_RX: "pcie_rx_gbps",
    GPM_NVLINK_TX: "nvlink_tx_gbps",
    GPM_NVLINK_RX: "nvlink_rx_gbps",
    GPM_DRAM_BW_UTIL: "dram_bw_util_pct",
}
#: GPM metrics that are percentages (the others are MiB/s, turned into GB/s).
GPM_PERCENT = frozenset({GPM_DRAM_BW_UTIL})

# Field ids (nvmlFieldValue_t).
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
FI_NVLINK_DATA_TX_KIB = 138
FI_NVLINK_DATA_RX_KIB = 139
FI_NVLINK_SPEED_MBPS_COMMON = 90
ALL_LINKS = 0xFFFFFFFF  # scopeId that sums every NVLink link (a bare field id reads link 0)

# NVML value types -> how many bits the counter has before it wraps (Linux LP64).
_VALUE_TYPE_BITS = {1: 32, 2: 64, 3: 64, 4: 63, 5: 31, 6: 16}
VALUE_TYPE_DOUBLE = 0

# Usable bytes/s per lane and direction after line coding, GB/s (PCI-SIG rates).
_PCIE_LANE_GBPS = {
    1: 0.25,
    2: 0.5,
    3: 8 * 128 / 130 / 8,
    4: 16 * 128 / 130 / 8,
    5: 32 * 128 / 130 / 8,
    6: 64 * 242 / 256 / 8,
}
# Per-link, per-direction NVLink GB/s by NVLink version, used when the speed field is n/a.
_NVLINK_LINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}


def pcie_peak_gbps(gen: int, width: int) -> float | NA:
    """Theoretical per-direction PCIe bandwidth for the link's *current* gen and width."""
    lane = _PCIE_LANE_GBPS.get(gen)
    if lane is None or width <= 0:
        return NA(f"unknown PCIe gen {gen} x{width}")
    return lane * width


def nvlink_link_gbps(version: int) -> float | NA:
    speed = _NVLINK_LINK_GBPS.get(version)
    return NA(f"unknown NVLink version {version}") if speed is None else speed


def nvlink_peak_gbps(active_links: int, link_gbps: float) -> float | NA:
    if active_links <= 0:
        return NA("no NVLink")
    return active_links * link_gbps


def mib_per_s_to_gbps(value: float) -> float:
    return value * MIB / GB


def kb_per_s_to_gbps(value: float) -> float:
    """nvmlDeviceGetPcieThroughput's KB/s (KiB, as nvidia-smi and nvitop read it) to GB/s."""
    return value * KIB / GB


def pct_of_peak(gbps: float | NA, peak: float | NA) -> float | NA:
    if isinstance(gbps, NA):
        return gbps
    if isinstance(peak, NA) or not peak > 0:
        return NA("unknown peak")
    return 100.0 * gbps / peak


# --------------------------------------------------------------------------- GPM


def gpm_rates(metrics: Iterable[tuple[int, int, float]], reason_for=None) -> dict[str, float | NA]:
    """GB/s (or %) per commtop metric from one nvmlGpmMetricsGet result between two samples.

    ``metrics`` holds (metricId, nvmlReturn, value in MiB/s, or % for GPM_PERCENT) entries; an entry whose
    return is not success becomes an NA (``reason_for(code)`` names it).
    """
    out: dict[str, float | NA] = {}
    for metric_id, ret, value in metrics:
        name = GPM_METRICS.get(int(metric_id))
        if name is None:
            continue
        if ret != 0:
            na = reason_for(ret) if reason_for is not None else None
            out[name] = na if isinstance(na, NA) else NA(f"GPM metric error {ret}")
        elif not math.isfinite(value) or value < 0:
            out[name] = NA(f"GPM returned {value!r}")
        elif int(metric_id) in GPM_PERCENT:
            out[name] = min(value, 100.0)
        else:
            out[name] = mib_per_s_to_gbps(value)
    return out


# --------------------------------------------------------------------------- counters


def value_bits(value_type: int) -> int | None:
    """Width of an NVML field value type (None for doubles, which do not wrap)."""
    return _VALUE_TYPE_BITS.get(value_type)


def counter_delta(prev: int, cur: int, bits: int) -> int:
    """Increase of a counter of ``bits`` bits from ``prev`` to ``cur``, assuming at most one wrap."""
    if cur >= prev:
        return cur - prev
    return cur + (1 << bits) - prev


def wrap_period_s(bits: int, unit_bytes: float, peak_gbps: float) -> float:
    """Seconds a counter of ``bits`` bits (in units of ``unit_bytes``) takes to wrap at link peak."""
    if peak_gbps <= 0:
        return math.inf
    return (1 << bits) * unit_bytes / (peak_gbps * GB)


@dataclass(frozen=True)
class CounterRate:
    """A rate from two counter readings, or why there is none; ``aliased`` when the interval
    exceeds the counter's wrap time at link peak (a wrap could hide whole periods)."""

    gbps: float | NA
    dt_s: float
    aliased: bool = False
    wrapped: bool = False


def counter_rate(
    prev: tuple[int, int],
    cur: tuple[int, int],
    bits: int,
    unit_bytes: float,
    peak_gbps: float | NA,
) -> CounterRate:
    """GB/s between two (value, timestamp_us) readings of a cumulative counter.

    A counter that can wrap more than once in the interval gives no rate: the verdict is
    ``aliased`` and the value an NA saying so (at 10 Hz on a Gen5 x16 link the 32-bit PCIe
    byte counters wrap every ~68-77 ms, so they cannot serve there).
    """
    (v0, t0), (v1, t1) = prev, cur
    dt_s = (t1 - t0) / 1e6
    if dt_s <= 0:
        return CounterRate(NA("no new counter sample"), dt_s)
    wrapped = v1 < v0
    if isinstance(peak_gbps, NA):
        if bits < 64:
            return CounterRate(NA(f"{bits}-bit counter and unknown link peak"), dt_s, aliased=True, wrapped=wrapped)
    else:
        period = wrap_period_s(bits, unit_bytes, peak_gbps)
        if dt_s >= period:
            return CounterRate(
                NA(f"{bits}-bit counter wraps every {period * 1e3:.0f} ms at link peak; interval {dt_s * 1e3:.0f} ms"),
                dt_s,
                aliased=True,
                wrapped=wrapped,
            )
    delta = counter_delta(v0, v1, bits)
    return CounterRate(delta * unit_bytes / dt_s / GB, dt_s, wrapped=wrapped)


def counter_can_serve(bits: int, unit_bytes: float, peak_gbps: float | NA, interval_s: float) -> bool:
    """Whether a counter sampled every ``interval_s`` gives honest rates at link peak."""
    if bits >= 64:
        return True
    if isinstance(peak_gbps, NA):
        return False
    return interval_s < wrap_period_s(bits, unit_bytes, peak_gbps)
