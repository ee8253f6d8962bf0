"""Node telemetry (TELEM / TELEM_CAPS) kept in bounded ring buffers for the TUI.

Plain Python + numpy (no Textual, no torch): the ingest thread calls :meth:`TelemetryModel.apply`
with each verified body, and every ~80 ms :meth:`TelemetryModel.snapshot` builds a frozen
:class:`TelemetrySnapshot` for the links panel and the header. Times come from the ticks
themselves (host ``time.time_ns``), so replay behaves like live.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from workers.wire import protocol
from workers.wire.telemetry import Caps, ProcInfo, Tick, decode_caps, decode_tick

HISTORY = 600  # samples per GPU (60 s at 10 Hz)
MAX_GPUS = 512  # (host, gpu) pairs kept; older ones are evicted first
MAX_HOSTS = 128
STALE_S = 3.0  # a node whose last tick is older than this is shown stale
HIGHLIGHT_S = 5.0  # how long a throttle / replay change stays highlighted
MAX_EVENTS = 64

SERIES = ("pcie_tx_gbps", "pcie_rx_gbps", "nvlink_tx_gbps", "nvlink_rx_gbps", "sm_clock_mhz", "power_w")
NO_NVML = "NVML not available"
NO_TELEMETRY = "no telemetry yet"

#: nvmlClocksEventReasons bits -> short names (GpuIdle is not a throttle and is not highlighted).
CLOCK_EVENT_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),
    (0x2, "app clocks"),
    (0x4, "SW power cap"),
    (0x8, "HW slowdown"),
    (0x10, "sync boost"),
    (0x20, "SW thermal"),
    (0x40, "HW thermal"),
    (0x80, "HW power brake"),
    (0x100, "display clocks"),
)
IDLE_BIT = 0x1


def clock_event_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in CLOCK_EVENT_BITS if mask & bit)


@dataclass(frozen=True)
class TelemEvent:
    """Something worth highlighting: a clock-event (throttle) change or PCIe replays."""

    t_ns: int
    host: str
    uuid: str
    kind: str  # "throttle" | "replay"
    text: str


@dataclass(frozen=True)
class GpuRow:
    """One GPU's latest readings, n/a reasons and recent history."""

    host: str
    uuid: str
    index: int
    name: str
    t_ns: int
    values: Mapping[str, float]  # metric -> value; NaN where n/a
    reasons: Mapping[str, str]  # metric -> why it is n/a (only for NaN metrics)
    pcie_peak_gbps: float
    nvlink_peak_gbps: float
    pcie_gen: int
    pcie_width: int
    sources: Mapping[str, str]
    times_ns: np.ndarray  # sample times of the series, oldest first
    series: Mapping[str, np.ndarray]  # SERIES name -> values aligned with times_ns
    throttle: tuple[str, ...]  # current clock-event reasons (without "idle")
    highlight: str  # a recent throttle/replay change, "" when none
    cost_us: float  # NVML time for this GPU in the last tick
    stale: bool

    def value(self, metric: str) -> float | None:
        v = self.values.get(metric, math.nan)
        return None if math.isnan(v) else v

    def reason(self, metric: str) -> str:
        """Why ``metric`` is n/a ("" when it has a value)."""
        if self.value(metric) is not None:
            return ""
        return self.reasons.get(metric) or "no reading yet"

    def pct(self, metric: str) -> float | None:
        """Share of the link's peak (PCIe from current gen x width; NVLink links x speed)."""
        v = self.value(metric)
        peak = self.pcie_peak_gbps if metric.startswith("pcie") else self.nvlink_peak_gbps
        if v is None or not peak > 0:
            return None
        return 100.0 * v / peak


@dataclass(frozen=True)
class HostRow:
    """One node: load, memory, the sampler's own cost and drops, and its workers' states."""

    host: str
    t_ns: int
    cpu_pct: float
    mem_used_bytes: int
    mem_total_bytes: int
    procs: Mapping[int, ProcInfo]
    cost_us: float
    dropped: int
    nvml: str  # "" when NVML works on this node
    notes: tuple[str, ...]
    stale: bool


@dataclass(frozen=True)
class TelemetrySnapshot:
    """Everything the links panel and the header need at one moment."""

    t_ns: int = 0
    gpus: tuple[GpuRow, ...] = ()
    hosts: tuple[HostRow, ...] = ()
    events: tuple[TelemEvent, ...] = ()
    nvml_note: str = NO_TELEMETRY  # "" when at least one node reads GPUs through NVML

    def host_line(self, short: bool = False) -> str:
        """One line for the header: CPU %, host memory, and what the node sampler costs (its
        wall time per tick: NVML + psutil + encode) and could not send, per node."""
        if not self.hosts:
            return "host: no telemetry yet"
        parts = []
        for h in self.hosts:
            mem = f"{h.mem_used_bytes / 2**30:.1f}/{h.mem_total_bytes / 2**30:.0f} GiB"
            cpu = "n/a" if math.isnan(h.cpu_pct) else f"{h.cpu_pct:.0f}%"
            stale = " (stale)" if h.stale else ""
            drops = f" · {h.dropped} sampler tick{'s' if h.dropped != 1 else ''} dropped" if h.dropped else ""
            if short:  # a narrow header: load and memory, the sampler's drops only when there are some
                who = f"{h.host}: " if len(self.hosts) > 1 else ""
                dropped = f" · {h.dropped} tick{'s' if h.dropped != 1 else ''} dropped" if h.dropped else ""
                parts.append(f"{who}cpu {cpu} mem {mem}{dropped}{stale}")
                continue
            parts.append(f"{h.host}: cpu {cpu} mem {mem} · sampler {h.cost_us / 1e3:.1f} ms/tick{drops}{stale}")
        return " | ".join(parts)

    def proc_status(self, host: str, pid: int) -> str | None:
        """A worker's process state as its node sampler saw it: running / sleeping / stopped /
        zombie / gone; None when unknown. ``stopped`` = stalled (SIGSTOP), ``gone`` = lost."""
        for h in self.hosts:
            if h.host == host:
                info = h.procs.get(pid)
                return None if info is None else info.status
        return None

    def gpu(self, host: str, uuid: str) -> GpuRow | None:
        for g in self.gpus:
            if g.host == host and g.uuid == uuid:
                return g
        return None


class _GpuBuffer:
    """Fixed-size ring of one GPU's samples."""

    def __init__(self, host: str, uuid: str) -> None:
        self.host, self.uuid = host, uuid
        self.times = np.zeros(HISTORY, dtype=np.int64)
        self.data = {name: np.full(HISTORY, np.nan) for name in SERIES}
        self.n = 0
        self.pos = 0
        self.values: dict[str, float] = {}
        self.t_ns = 0
        self.pcie_peak = math.nan
        self.nvlink_peak = math.nan
        self.cost_us = 0.0
        self.mask: int | None = None
        self.replay: float | None = None
        self.highlight = ""
        self.highlight_t = 0

    def push(self, t_ns: int, values: dict[str, float]) -> None:
        self.times[self.pos] = t_ns
        for name in SERIES:
            self.data[name][self.pos] = values.get(name, math.nan)
        self.pos = (self.pos + 1) % HISTORY
        self.n = min(self.n + 1, HISTORY)
        self.values = values
        self.t_ns = t_ns

    def ordered(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if self.n < HISTORY:
            idx = slice(0, self.n)
            times = self.times[idx].copy()
            return times, {k: v[idx].copy() for k, v in self.data.items()}
        order = np.r_[self.pos : HISTORY, 0 : self.pos]
        return self.times[order], {k: v[order] for k, v in self.data.items()}


@dataclass
class _HostState:
    tick: Tick | None = None
    caps: Caps | None = None
    gpu_order: list[str] = field(default_factory=list)


class TelemetryModel:
    """Applies TELEM / TELEM_CAPS bodies (or decoded Tick / Caps); builds frozen snapshots.

    Bounded: HISTORY samples per GPU, at most MAX_GPUS GPUs and MAX_HOSTS hosts, MAX_EVENTS
    events. Not thread-safe by itself: the ingest thread owns it.
    """

    def __init__(self) -> None:
        self._gpus: dict[tuple[str, str], _GpuBuffer] = {}
        self._hosts: dict[str, _HostState] = {}
        self._events: deque[TelemEvent] = deque(maxlen=MAX_EVENTS)
        self.rejected = 0

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def apply(self, body: Mapping[str, Any] | Tick | Caps) -> None:
        """Apply one verified TELEM or TELEM_CAPS body; malformed ones are counted, not raised."""
        try:
            if isinstance(body, (Tick, Caps)):
                msg = body
            elif body.get("k") == protocol.TELEM:
                msg = decode_tick(body)
            elif body.get("k") == protocol.TELEM_CAPS:
                msg = decode_caps(body)
            else:
                return
        except protocol.ProtocolError:
            self.rejected += 1
            return
        if isinstance(msg, Caps):
            self._host(msg.host).caps = msg
        else:
            self._apply_tick(msg)

    def _host(self, host: str) -> _HostState:
        state = self._hosts.get(host)
        if state is None:
            if len(self._hosts) >= MAX_HOSTS:
                del self._hosts[min(self._hosts, key=self._last_t)]
            state = self._hosts[host] = _HostState()
        return state

    def _last_t(self, host: str) -> int:
        tick = self._hosts[host].tick
        return tick.t_ns if tick is not None else 0

    def _apply_tick(self, tick: Tick) -> None:
        state = self._host(tick.host)
        state.tick = tick
        state.gpu_order = list(tick.uuids)
        for i, uuid in enumerate(tick.uuids):
            key = (tick.host, uuid)
            buf = self._gpus.get(key)
            if buf is None:
                if len(self._gpus) >= MAX_GPUS:
                    del self._gpus[min(self._gpus, key=lambda k: self._gpus[k].t_ns)]
                buf = self._gpus[key] = _GpuBuffer(tick.host, uuid)
            values = {name: float(arr[i]) for name, arr in tick.metrics.items()}
            buf.pcie_peak = float(tick.pcie_peak_gbps[i])
            buf.nvlink_peak = float(tick.nvlink_peak_gbps[i])
            buf.cost_us = float(tick.gpu_cost_us[i])
            self._events_for(buf, tick.t_ns, values)
            buf.push(tick.t_ns, values)

    def _events_for(self, buf: _GpuBuffer, t_ns: int, values: dict[str, float]) -> None:
        raw = values.get("throttle_reasons", math.nan)
        if not math.isnan(raw):
            mask = int(raw) & ~IDLE_BIT
            if buf.mask is not None and mask != buf.mask:
                names = clock_event_names(mask)
                text = "clocks: " + (", ".join(names) if names else "no throttle")
                self._event(buf, t_ns, "throttle", text, highlight=bool(names))
            buf.mask = mask
        replay = values.get("pcie_replay_count", math.nan)
        if not math.isnan(replay):
            if buf.replay is not None and replay > buf.replay:
                self._event(buf, t_ns, "replay", f"PCIe replay +{int(replay - buf.replay)}", highlight=True)
            buf.replay = replay

    def _event(self, buf: _GpuBuffer, t_ns: int, kind: str, text: str, highlight: bool) -> None:
        self._events.append(TelemEvent(t_ns, buf.host, buf.uuid, kind, text))
        if highlight:
            buf.highlight, buf.highlight_t = text, t_ns
        elif kind == "throttle" and buf.highlight.startswith("clocks"):
            buf.highlight = ""

    def snapshot(self, now_ns: int, clock_offsets_ns: Mapping[str, int] | None = None) -> TelemetrySnapshot:
        """``clock_offsets_ns``: per host, its clock minus the reference host's (the run
        model estimates them); every time of that host is shifted onto the reference clock,
        so one host's PCIe samples line up with another's collectives."""
        offsets = clock_offsets_ns or {}
        gpus: list[GpuRow] = []
        hosts: list[HostRow] = []
        for host, state in sorted(self._hosts.items()):
            tick, caps = state.tick, state.caps
            if tick is None:
                continue
            off = int(offsets.get(host, 0))
            stale = (now_ns - (tick.t_ns - off)) / 1e9 > STALE_S
            notes = caps.notes if caps is not None else ()
            hosts.append(
                HostRow(
                    host=host,
                    t_ns=tick.t_ns - off,
                    cpu_pct=tick.cpu_pct,
                    mem_used_bytes=tick.mem_used_bytes,
                    mem_total_bytes=tick.mem_total_bytes,
                    procs={p.pid: p for p in tick.procs},
                    cost_us=tick.cost_us,
                    dropped=tick.dropped,
                    nvml=tick.nvml,
                    notes=notes,
                    stale=stale,
                )
            )
            gcaps = {g.uuid: g for g in caps.gpus} if caps is not None else {}
            for uuid in state.gpu_order:
                buf = self._gpus.get((host, uuid))
                if buf is None:
                    continue
                gpus.append(self._row(buf, gcaps.get(uuid), now_ns, stale, off))
        if not hosts:
            note = NO_TELEMETRY
        elif gpus:
            note = ""
        else:
            reasons = sorted({h.nvml for h in hosts if h.nvml})
            note = (NO_NVML if NO_NVML in reasons else reasons[0]) if reasons else "no GPUs"
        events = tuple(
            replace(e, t_ns=e.t_ns - int(offsets[e.host])) if offsets.get(e.host) else e for e in self._events
        )
        return TelemetrySnapshot(t_ns=now_ns, gpus=tuple(gpus), hosts=tuple(hosts), events=events, nvml_note=note)

    def _row(self, buf: _GpuBuffer, caps: Any, now_ns: int, stale: bool, offset_ns: int = 0) -> GpuRow:
        times, series = buf.ordered()
        times = times - offset_ns if offset_ns else times
        reasons = {}
        for name, value in buf.values.items():
            if math.isnan(value):
                reasons[name] = (caps.na.get(name, "") if caps is not None else "") or "no reading yet"
        highlight = buf.highlight if buf.highlight and (now_ns - buf.highlight_t) / 1e9 < HIGHLIGHT_S else ""
        raw = buf.values.get("throttle_reasons", math.nan)
        throttle = () if math.isnan(raw) else clock_event_names(int(raw) & ~IDLE_BIT)
        return GpuRow(
            host=buf.host,
            uuid=buf.uuid,
            index=caps.index if caps is not None else -1,
            name=caps.name if caps is not None else "",
            t_ns=buf.t_ns - offset_ns,
            values=dict(buf.values),
            reasons=reasons,
            pcie_peak_gbps=buf.pcie_peak,
            nvlink_peak_gbps=buf.nvlink_peak,
            pcie_gen=caps.pcie_gen if caps is not None else -1,
            pcie_width=caps.pcie_width if caps is not None else -1,
            sources=dict(caps.sources) if caps is not None else {},
            times_ns=times,
            series=series,
            throttle=throttle,
            highlight=highlight,
            cost_us=buf.cost_us,
            stale=stale,
        )
