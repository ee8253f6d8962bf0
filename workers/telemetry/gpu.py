"""Per-GPU probe: discovers what a GPU can report, then reads one tick's metrics.

Sources for link throughput, in order of preference (see shared/FACTS.md, measured on H200):
GPM metrics (0.3-0.8 ms per sample, Hopper+); cumulative field counters with timestamp rates
(only where the counter cannot wrap between two ticks); ``nvmlDeviceGetPcieThroughput`` last,
in its own thread, because each call blocks ~21 ms.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from workers.telemetry import nvml, rates
from workers.telemetry.nvml import NA
from workers.wire.protocol import LINK_METRICS

Value = float | NA
#: Metrics only GPM gives (no field counter or older API to fall back on): absent without GPM.
GPM_ONLY = ("dram_bw_util_pct",)
GPM_READ = (*LINK_METRICS, *GPM_ONLY)
WARMING = NA("warming up")
SLOW_EVERY = 10  # ticks between reads of PCIe gen/width, replay counter and power limit


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def field_reading(fv: Any) -> tuple[int, float | int, int, int] | NA:
    """(valueType, value, timestamp_us, nvmlReturn) of one nvmlFieldValue_t, or its NA."""
    na = nvml.ret_na(int(fv.nvmlReturn))
    if na is not None:
        return na
    vt = int(fv.valueType)
    union = fv.value
    value = {
        0: union.dVal,
        1: union.uiVal,
        2: union.ulVal,
        3: union.ullVal,
        4: union.sllVal,
        5: union.siVal,
        6: union.usVal,
    }.get(vt)
    if value is None:
        return NA(f"unknown NVML value type {vt}")
    return vt, value, int(fv.timestamp), 0


def nvlink_links(states: list[int | NA]) -> tuple[int, NA | None]:
    """Active link count from nvmlDeviceGetNvLinkState per link; "no NVLink" when no link is
    supported (H200 PCIe: NotSupported on all 18) or none is active."""
    supported = [s for s in states if not isinstance(s, NA)]
    if not supported:
        return 0, NA(nvml.NO_NVLINK)
    active = sum(1 for s in supported if s == 1)
    return active, (None if active else NA(nvml.NO_NVLINK, "no active link"))


class ThroughputThread:
    """Last-resort PCIe source: nvmlDeviceGetPcieThroughput blocks ~21 ms per call, so it
    runs here, never on the tick; the tick reads the latest values (KB/s) and their age."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles
        self._latest: list[tuple[Value, Value, float]] = [(WARMING, WARMING, 0.0)] * len(handles)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commtop-pcie-throughput", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        mod = nvml.pynvml
        while not self._stop.is_set():
            for i, h in enumerate(self._handles):
                tx = nvml.query(mod.nvmlDeviceGetPcieThroughput, h, mod.NVML_PCIE_UTIL_TX_BYTES)
                rx = nvml.query(mod.nvmlDeviceGetPcieThroughput, h, mod.NVML_PCIE_UTIL_RX_BYTES)
                conv = [v if isinstance(v, NA) else rates.kb_per_s_to_gbps(float(v)) for v in (tx, rx)]
                self._latest[i] = (conv[0], conv[1], time.monotonic())
            self._stop.wait(0.05)

    def latest(self, i: int) -> tuple[Value, Value]:
        tx, rx, at = self._latest[i]
        if at and time.monotonic() - at > 2.0:
            stale = NA("PCIe throughput reading is stale")
            return stale, stale
        return tx, rx

    def stop(self) -> None:
        self._stop.set()


class GpuProbe:
    """One GPU: static capabilities at open, then :meth:`read` once per tick."""

    def __init__(self, handle: Any, interval_s: float, use_gpm: bool = True) -> None:
        mod = nvml.pynvml
        self.use_gpm = use_gpm
        self.handle = handle
        self.interval_s = interval_s
        self.uuid = _s(nvml.query(mod.nvmlDeviceGetUUID, handle))
        idx = nvml.query(mod.nvmlDeviceGetIndex, handle)
        self.index = -1 if isinstance(idx, NA) else int(idx)
        name = nvml.query(mod.nvmlDeviceGetName, handle)
        self.name = "?" if isinstance(name, NA) else _s(name)
        self.sources: dict[str, str] = {}
        self.static_na: dict[str, NA] = {}
        self.notes: list[str] = []
        self.last_na: dict[str, NA] = {}
        self.pcie_gen, self.pcie_width, self.pcie_peak = self._pcie_link()
        self.nvlink_links, self.nvlink_peak = self._nvlink()
        self._gpm_pair: list[Any] | None = None
        self._gpm_prev_t = 0.0
        self._gpm_last: dict[str, Value] = {}
        self._counters: dict[str, tuple[int, int, int, float]] = {}  # metric -> (field, scope, bits, unit)
        self._counter_prev: dict[str, tuple[int, int]] = {}
        self.needs_throughput_thread = False
        self._ticks = 0
        self._slow_last: dict[str, Value] = {}
        self.throughput: ThroughputThread | None = None
        self.throughput_slot = -1
        self._choose_sources()

    # ------------------------------------------------------------------ discovery

    def _pcie_link(self) -> tuple[int, int, Value]:
        mod = nvml.pynvml
        gen = nvml.query(mod.nvmlDeviceGetCurrPcieLinkGeneration, self.handle)
        width = nvml.query(mod.nvmlDeviceGetCurrPcieLinkWidth, self.handle)
        if isinstance(gen, NA) or isinstance(width, NA):
            na = gen if isinstance(gen, NA) else width
            return -1, -1, na  # type: ignore[return-value]
        return int(gen), int(width), rates.pcie_peak_gbps(int(gen), int(width))

    def _nvlink(self) -> tuple[int, Value]:
        mod = nvml.pynvml
        states: list[int | NA] = []
        for link in range(mod.NVML_NVLINK_MAX_LINKS):
            state = nvml.query(mod.nvmlDeviceGetNvLinkState, self.handle, link)
            if isinstance(state, NA) and state.reason.startswith("NVML error"):  # invalid argument: no such link
                break
            states.append(state)
        active, none = nvlink_links(states)
        if none is not None:
            return 0, none
        speed: Value = NA("unknown")
        fv = nvml.query(mod.nvmlDeviceGetFieldValues, self.handle, [rates.FI_NVLINK_SPEED_MBPS_COMMON])
        if not isinstance(fv, NA):
            reading = field_reading(fv[0])
            if not isinstance(reading, NA) and reading[1] > 0:
                speed = float(reading[1]) * 1e6 / rates.GB
        if isinstance(speed, NA):
            version = nvml.query(mod.nvmlDeviceGetNvLinkVersion, self.handle, 0)
            speed = NA("unknown") if isinstance(version, NA) else rates.nvlink_link_gbps(int(version))
        if isinstance(speed, NA):
            return active, speed
        return active, rates.nvlink_peak_gbps(active, speed)

    def _choose_sources(self) -> None:
        mod = nvml.pynvml
        support = nvml.query(mod.nvmlGpmQueryDeviceSupport, self.handle) if self.use_gpm else NA("GPM disabled")
        gpm_ok = not isinstance(support, NA) and bool(support.isSupportedDevice)
        if gpm_ok:
            a = nvml.query(mod.nvmlGpmSampleAlloc)
            b = nvml.query(mod.nvmlGpmSampleAlloc)
            first = nvml.query(mod.nvmlGpmSampleGet, self.handle, a) if not isinstance(a, NA) else a
            if isinstance(a, NA) or isinstance(b, NA) or isinstance(first, NA):
                gpm_ok = False
                self.notes.append(
                    f"GPM sampling failed: {a if isinstance(a, NA) else b if isinstance(b, NA) else first}"
                )
            else:
                self._gpm_pair = [a, b]
                self._gpm_prev_t = time.perf_counter()
        else:
            why = support if isinstance(support, NA) else NA(nvml.NOT_SUPPORTED)
            self.notes.append(f"GPM: {why}")
        no_nvlink = isinstance(self.nvlink_peak, NA) and self.nvlink_peak.reason == nvml.NO_NVLINK
        for metric in LINK_METRICS:
            is_nvlink = metric.startswith("nvlink")
            if is_nvlink and no_nvlink:
                self.static_na[metric] = NA(nvml.NO_NVLINK)
            elif gpm_ok:
                self.sources[metric] = "gpm"
        for metric in GPM_ONLY:
            if gpm_ok:
                self.sources[metric] = "gpm"
            else:
                self.static_na[metric] = NA("needs GPM")
        # Fallbacks for metrics GPM cannot give.
        for metric, fid, unit in (
            ("pcie_tx_gbps", rates.FI_PCIE_TX_BYTES, 1.0),
            ("pcie_rx_gbps", rates.FI_PCIE_RX_BYTES, 1.0),
            ("nvlink_tx_gbps", rates.FI_NVLINK_DATA_TX_KIB, float(rates.KIB)),
            ("nvlink_rx_gbps", rates.FI_NVLINK_DATA_RX_KIB, float(rates.KIB)),
        ):
            if metric in self.sources or metric in self.static_na:
                continue
            scope = rates.ALL_LINKS if metric.startswith("nvlink") else 0
            verdict = self._try_counter(metric, fid, scope, unit)
            if verdict is None:
                self.sources[metric] = "field"
            elif metric.startswith("pcie"):
                self.notes.append(f"{metric}: field {fid}: {verdict.reason}")
                self.sources[metric] = "pcie_throughput"
                self.needs_throughput_thread = True
            else:
                self.static_na[metric] = verdict

    def _try_counter(self, metric: str, fid: int, scope: int, unit: float) -> NA | None:
        """Use a cumulative field counter if it is supported and cannot wrap between ticks."""
        mod = nvml.pynvml
        fv = nvml.query(mod.nvmlDeviceGetFieldValues, self.handle, [(fid, scope)])
        if isinstance(fv, NA):
            return fv
        reading = field_reading(fv[0])
        if isinstance(reading, NA):
            return reading
        vt, value, ts, _ = reading
        bits = rates.value_bits(vt)
        if bits is None:
            return NA(f"field {fid} is not an integer counter")
        peak = self.pcie_peak if metric.startswith("pcie") else self.nvlink_peak
        if not rates.counter_can_serve(bits, unit, peak, self.interval_s * 1.5):
            period = "unknown" if isinstance(peak, NA) else f"{rates.wrap_period_s(bits, unit, peak) * 1e3:.0f} ms"
            return NA(f"{bits}-bit counter wraps every {period} at link peak: cannot give a rate at 10 Hz")
        self._counters[metric] = (fid, scope, bits, unit)
        self._counter_prev[metric] = (int(value), ts)
        return None

    # ------------------------------------------------------------------ per tick

    def read(self) -> dict[str, Value]:
        """One tick's metrics (GB/s, MHz, W, %, bytes, counts) or NAs."""
        mod = nvml.pynvml
        h = self.handle
        out: dict[str, Value] = dict(self.static_na)
        self._ticks += 1
        slow = self._ticks % SLOW_EVERY == 1  # rarely-changing reads (~0.4 ms) once a second
        if slow:
            gen, width, peak = self._pcie_link()
            if gen > 0:
                self.pcie_gen, self.pcie_width, self.pcie_peak = gen, width, peak
        if self._gpm_pair is not None:
            out.update({m: v for m, v in self._read_gpm().items() if self.sources.get(m) == "gpm"})
        if self._counters:
            out.update(self._read_counters())
        if self.throughput is not None:
            tx, rx = self.throughput.latest(self.throughput_slot)
            for metric, v in (("pcie_tx_gbps", tx), ("pcie_rx_gbps", rx)):
                if self.sources.get(metric) == "pcie_throughput":
                    out[metric] = v
        sm = nvml.query(mod.nvmlDeviceGetClockInfo, h, mod.NVML_CLOCK_SM)
        mem = nvml.query(mod.nvmlDeviceGetClockInfo, h, mod.NVML_CLOCK_MEM)
        out["sm_clock_mhz"] = sm if isinstance(sm, NA) else float(sm)
        out["mem_clock_mhz"] = mem if isinstance(mem, NA) else float(mem)
        power = nvml.query(mod.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = power if isinstance(power, NA) else power / 1000.0
        out["throttle_reasons"] = self._throttle()
        util = nvml.query(mod.nvmlDeviceGetUtilizationRates, h)
        out["gpu_util_pct"] = util if isinstance(util, NA) else float(util.gpu)
        meminfo = nvml.query(mod.nvmlDeviceGetMemoryInfo, h)
        out["mem_used_bytes"] = meminfo if isinstance(meminfo, NA) else float(meminfo.used)
        if slow or not self._slow_last:
            replay = nvml.query(mod.nvmlDeviceGetPcieReplayCounter, h)
            self._slow_last["pcie_replay_count"] = replay if isinstance(replay, NA) else float(replay)
            limit = nvml.query(mod.nvmlDeviceGetEnforcedPowerLimit, h)
            self._slow_last["power_limit_w"] = limit if isinstance(limit, NA) else limit / 1000.0
        out.update(self._slow_last)
        for metric in LINK_METRICS:
            out.setdefault(metric, NA(nvml.NOT_SUPPORTED))
        self.last_na = {k: v for k, v in out.items() if isinstance(v, NA)}
        return out

    def _throttle(self) -> Value:
        mod = nvml.pynvml
        fn = (
            getattr(mod, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or mod.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        value = nvml.query(fn, self.handle)
        return value if isinstance(value, NA) else float(value)

    def _read_gpm(self) -> dict[str, Value]:
        mod = nvml.pynvml
        now = time.perf_counter()
        if now - self._gpm_prev_t < 0.9 * self.interval_s and self._gpm_last:
            return self._gpm_last  # GPM wants samples >= ~100 ms apart: repeat, do not resample
        assert self._gpm_pair is not None
        prev, cur = self._gpm_pair
        got = nvml.query(mod.nvmlGpmSampleGet, self.handle, cur)
        if isinstance(got, NA):
            return {m: got for m in GPM_READ}
        mg = mod.c_nvmlGpmMetricsGet_t()
        mg.version = mod.NVML_GPM_METRICS_GET_VERSION
        mg.sample1 = prev
        mg.sample2 = cur
        ids = list(rates.GPM_METRICS)
        mg.numMetrics = len(ids)
        for i, metric_id in enumerate(ids):
            mg.metrics[i].metricId = metric_id
        res = nvml.query(mod.nvmlGpmMetricsGet, mg)
        self._gpm_pair = [cur, prev]
        self._gpm_prev_t = now
        if isinstance(res, NA):
            self._gpm_last = {m: res for m in GPM_READ}
        else:
            entries = [
                (int(res.metrics[i].metricId), int(res.metrics[i].nvmlReturn), float(res.metrics[i].value))
                for i in range(len(ids))
            ]
            self._gpm_last = rates.gpm_rates(entries, nvml.ret_na)
        return self._gpm_last

    def _read_counters(self) -> dict[str, Value]:
        mod = nvml.pynvml
        metrics = list(self._counters)
        fids = [(self._counters[m][0], self._counters[m][1]) for m in metrics]
        fv = nvml.query(mod.nvmlDeviceGetFieldValues, self.handle, fids)
        out: dict[str, Value] = {}
        for i, metric in enumerate(metrics):
            if isinstance(fv, NA):
                out[metric] = fv
                continue
            reading = field_reading(fv[i])
            if isinstance(reading, NA):
                out[metric] = reading
                continue
            _, value, ts, _ = reading
            _, _, bits, unit = self._counters[metric]
            peak = self.pcie_peak if metric.startswith("pcie") else self.nvlink_peak
            prev = self._counter_prev.get(metric)
            self._counter_prev[metric] = (int(value), ts)
            if prev is None:
                out[metric] = WARMING
                continue
            rate = rates.counter_rate(prev, (int(value), ts), bits, unit, peak)
            if isinstance(rate.gbps, NA) and rate.gbps.reason == "no new counter sample":
                # NVML refreshes some counters slower than we tick: keep the previous reading
                self._counter_prev[metric] = prev
            out[metric] = rate.gbps
        return out

    def peaks(self) -> tuple[float, float]:
        p = self.pcie_peak
        n = self.nvlink_peak
        return (math.nan if isinstance(p, NA) else float(p)), (math.nan if isinstance(n, NA) else float(n))

    def close(self) -> None:
        mod = nvml.pynvml
        if self._gpm_pair is not None:
            for sample in self._gpm_pair:
                nvml.query(mod.nvmlGpmSampleFree, sample)
            self._gpm_pair = None
