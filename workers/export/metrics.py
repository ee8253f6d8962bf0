"""A node's metrics: every local rank's decoded batches and the sampler's ticks, folded into
bounded counters and histograms with numpy (one pass per batch, no Python per record).

:class:`NodeMetrics` is plain Python + numpy (tests feed it real batches); :meth:`families`
turns a consistent copy of it into prometheus_client metric families at scrape time.

Label sets are bounded: ``rank`` (this node's ranks), ``op`` (protocol.OP_NAMES), ``size``
(power-of-two bucket of the collective's bytes, clamped to 1 KiB..16 GiB: 25 values), ``mode``
(protocol.MODES); copies by ``direction`` and ``pinned``; GPUs by index and UUID.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.wire import protocol
from workers.wire.protocol import COLL, COPY, Batch
from workers.wire.straggler import STRAGGLER_ITERS, clearly_last

#: Histogram upper bounds in seconds: 1-2-5 steps from 10 µs to 10 s (NCCL on NVLink to a hung peer).
BUCKETS_S: tuple[float, ...] = tuple(m * 10.0**e for e in range(-5, 1) for m in (1, 2, 5)) + (10.0,)
_BOUNDS = np.array(BUCKETS_S)
SIZE_MIN_LOG2, SIZE_MAX_LOG2 = 10, 34  # 1 KiB .. 16 GiB; smaller/larger sizes land in the end buckets
#: A rank whose records stop for this long while it has not said bye counts one stall (the TUI's "stale").
STALL_AFTER_S = 2.0
#: Iterations remembered to find, per complete iteration, which local rank arrived last.
STRAGGLER_WINDOW = 4096
MAX_LOCAL_RANKS = 64
#: nvmlClocksEventReasons bits, named as in NVML (a GPU's "throttle reasons").
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
#: Labels of every collective series. The per-rank overlap class of issue 13 ("during copies",
#: "after copies", "no copies") goes here, as ``overlap``, once the records carry it: add it to
#: this tuple and to the key built in :meth:`NodeMetrics._add_coll` (4 values more per key).
COLL_LABELS: tuple[str, ...] = ("rank", "op", "size", "mode")
COPY_LABELS: tuple[str, ...] = ("rank", "direction", "pinned")
GPU_LABELS: tuple[str, ...] = ("gpu", "uuid")


def size_label(log2: int) -> str:
    """``2**log2`` bytes as "1KiB" .. "16GiB" (the bucket holds sizes in [2**log2, 2**(log2+1)))."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if log2 >= shift:
            return f"{1 << (log2 - shift)}{unit}"
    return f"{1 << log2}B"


def size_buckets(nbytes: np.ndarray) -> np.ndarray:
    safe = np.maximum(nbytes.astype(np.float64), 1.0)
    return np.clip(np.floor(np.log2(safe)), SIZE_MIN_LOG2, SIZE_MAX_LOG2).astype(np.int64)


@dataclass
class Hist:
    """One labelled histogram series set: counts per bucket (the last is +Inf), sum, count."""

    buckets: np.ndarray = field(default_factory=lambda: np.zeros(len(BUCKETS_S) + 1, dtype=np.int64))
    sum_s: float = 0.0
    bytes: int = 0
    bus_bytes: float = 0.0
    last_busbw: float = math.nan  # bytes/s, median of the latest batch of this key

    def add(self, dur_s: np.ndarray) -> None:
        self.buckets += np.bincount(np.searchsorted(_BOUNDS, dur_s, side="left"), minlength=len(self.buckets))
        self.sum_s += float(dur_s.sum(dtype=np.float64))

    @property
    def count(self) -> int:
        return int(self.buckets.sum())


@dataclass
class RankState:
    epoch: int = 0
    last_record_s: float = 0.0  # wall clock of the latest record (its host_ns / start_ns)
    last_arrival: float | None = None  # monotonic, when its latest batch arrived here (None: none yet)
    lost_batches: int = 0  # gaps in its batch sequence numbers seen by this exporter
    collector_dropped: int = 0  # records it could not queue for the collector (its own count)
    stalls: int = 0
    stalled: bool = False
    finished: bool = False
    straggler: int = 0
    next_seq: dict[str, int] = field(default_factory=lambda: {COLL: 0, COPY: 0})
    #: its last Hello's collective begun and not finished: (seconds in it then, when it came)
    inside: tuple[float, float] | None = None


@dataclass
class GpuState:
    uuid: str
    link_bytes: dict[str, float] = field(default_factory=dict)  # pcie_tx ... -> bytes so far
    gauges: dict[str, float] = field(default_factory=dict)
    throttle: int = -1


class NodeMetrics:
    """Everything one node exports; thread-safe (receiver thread, tick loop, HTTP scrapes)."""

    def __init__(self, host: str, clock: Any = time.monotonic) -> None:
        self.host = host
        self.clock = clock
        self.lock = threading.Lock()
        self.coll: dict[tuple[int, int, int, int], Hist] = {}
        self.copy: dict[tuple[int, int, int], Hist] = {}
        self.ranks: dict[int, RankState] = {}
        self.gpus: dict[int, GpuState] = {}
        self.rejected: dict[str, int] = {}
        self.records = 0
        # straggler window: one row per local rank, one column per iteration % STRAGGLER_WINDOW
        self._rows: dict[int, int] = {}
        self._ms = np.full((MAX_LOCAL_RANKS, STRAGGLER_WINDOW), np.nan, dtype=np.float32)
        self._tag = np.full((MAX_LOCAL_RANKS, STRAGGLER_WINDOW), -1, dtype=np.int64)
        # each record's (op, dtype, size): a complete iteration whose ranks differ in it compared
        # different collectives (the ranks order theirs differently: threads), and ends the count
        self._shape = np.full((MAX_LOCAL_RANKS, STRAGGLER_WINDOW), -1, dtype=np.int64)
        #: The node's ranks were seen to order their collectives differently: no straggler count.
        self.interleaved = False
        self._counted = np.full(STRAGGLER_WINDOW, -1, dtype=np.int64)
        # the row that arrived last in each of the newest STRAGGLER_ITERS complete iterations
        self._recent_last = np.full(STRAGGLER_ITERS, -1, dtype=np.int64)
        self._recent_at = 0
        self._last_tick_ns = 0

    # ------------------------------------------------------------------ input

    def add_message(self, message: Any) -> None:
        """A verified, decoded message from a rank (Batch, Bye; others are ignored)."""
        with self.lock:
            if isinstance(message, Batch):
                self._add_batch(message)
            elif isinstance(message, protocol.Bye):
                state = self._rank(message.rank)
                state.finished, state.inside = True, None
            elif isinstance(message, protocol.Hello):
                h = message
                self._rank(h.rank).inside = (h.inside_s, self.clock()) if h.inside else None

    def reject(self, reason: str) -> None:
        with self.lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def _rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState()
        return state

    def _add_batch(self, batch: Batch) -> None:
        state = self._rank(batch.rank)
        expected = state.next_seq[batch.kind]
        if batch.seq > expected:
            state.lost_batches += batch.seq - expected
        state.next_seq[batch.kind] = max(expected, batch.seq + 1)
        state.collector_dropped = max(state.collector_dropped, batch.dropped)
        state.epoch = batch.epoch_in_force
        state.last_arrival = self.clock()
        state.stalled = False
        n = len(batch)
        if n == 0:
            return
        self.records += n
        if batch.kind == COLL:
            self._add_coll(batch, state)
        else:
            self._add_copy(batch, state)

    def _add_coll(self, batch: Batch, state: RankState) -> None:
        c = batch.columns
        dur_s = c["dur_us"].astype(np.float64) * 1e-6
        size = size_buckets(c["nbytes"])
        key = (c["op"].astype(np.int64) << 16) | (size << 8) | c["mode"].astype(np.int64)
        uniq, inverse = np.unique(key, return_inverse=True)
        for i, k in enumerate(uniq.tolist()):
            sel = inverse == i
            hist = self.coll.get((batch.rank, k >> 16, (k >> 8) & 0xFF, k & 0xFF))
            if hist is None:
                hist = self.coll[(batch.rank, k >> 16, (k >> 8) & 0xFF, k & 0xFF)] = Hist()
            hist.add(dur_s[sel])
            nbytes = c["nbytes"][sel]
            hist.bytes += int(nbytes.sum())
            bus = c["busbw"][sel].astype(np.float64)
            # bus bytes = busbw * duration: rate(bus_bytes) / rate(duration_sum) is the time-weighted busbw
            hist.bus_bytes += float((bus * 1e9 * dur_s[sel]).sum())
            hist.last_busbw = float(np.median(bus)) * 1e9
        state.last_record_s = max(state.last_record_s, float(c["start_ns"][-1]) * 1e-9)
        shape = (c["nbytes"].astype(np.int64) << 16) | (c["op"].astype(np.int64) << 8) | c["dtype"]
        self._add_straggler(batch.rank, c["iteration"], c["dur_us"], shape)

    def _add_copy(self, batch: Batch, state: RankState) -> None:
        c = batch.columns
        dur_s = c["dur_us"].astype(np.float64) * 1e-6
        key = (c["direction"].astype(np.int64) << 1) | (c["pinned"].astype(np.int64) & 1)
        uniq, inverse = np.unique(key, return_inverse=True)
        for i, k in enumerate(uniq.tolist()):
            sel = inverse == i
            hist = self.copy.get((batch.rank, k >> 1, k & 1))
            if hist is None:
                hist = self.copy[(batch.rank, k >> 1, k & 1)] = Hist()
            hist.add(dur_s[sel])
            hist.bytes += int(c["nbytes"][sel].sum())

    def _add_straggler(self, rank: int, iteration: np.ndarray, dur_us: np.ndarray, shape: np.ndarray) -> None:
        """Count, per complete iteration of this node's ranks, the rank that arrived last (all
        ranks leave a collective together, so the last to arrive waited least), while it is
        clearly the node's straggler: the TUI's test (:func:`clearly_last`) over the node's newest
        STRAGGLER_ITERS complete iterations. Even ranks take turns being last by chance: no count.
        Where the ranks' records of one iteration differ in (op, dtype, size), their k-th
        collectives are not one collective (collectives from several threads): nothing is counted
        from then on, as the TUI compares no ranks by iteration then."""
        if self.interleaved:
            return
        row = self._rows.get(rank)
        if row is None:
            if len(self._rows) >= MAX_LOCAL_RANKS:
                return
            row = self._rows[rank] = len(self._rows)
        if len(iteration) > STRAGGLER_WINDOW:
            iteration, dur_us = iteration[-STRAGGLER_WINDOW:], dur_us[-STRAGGLER_WINDOW:]
            shape = shape[-STRAGGLER_WINDOW:]
        slots = iteration % STRAGGLER_WINDOW
        self._ms[row, slots] = dur_us
        self._tag[row, slots] = iteration
        self._shape[row, slots] = shape
        n = len(self._rows)
        if n < 2:
            return
        complete = (self._tag[:n, slots] == iteration).all(axis=0) & (self._counted[slots] != iteration)
        if not complete.any():
            return
        done = slots[complete]
        if (self._shape[:n, done] != self._shape[0, done]).any():
            self.interleaved = True
            return
        self._counted[done] = iteration[complete]
        last = np.argmin(self._ms[:n, done], axis=0)
        recent, tail = self._recent_last, last[-len(self._recent_last) :]
        recent[(self._recent_at + np.arange(len(tail))) % len(recent)] = tail
        self._recent_at += len(tail)
        window = recent[recent >= 0]
        by_row = np.bincount(window, minlength=n)
        best = int(np.argmax(by_row))
        if not clearly_last(int(by_row[best]), len(window), n):
            return
        for r, row_index in self._rows.items():
            if row_index == best:
                self._rank(r).straggler += int(np.count_nonzero(last == best))

    def check_stalls(self) -> None:
        """Called a few times a second: a rank silent for STALL_AFTER_S (not finished) stalls once."""
        now = self.clock()
        with self.lock:
            for state in self.ranks.values():
                # Only records that stopped: a rank whose first batch has not come (its Hello
                # does, at once) counted a stall at start-up on every rank.
                arrived = state.last_arrival
                if not state.stalled and not state.finished and arrived is not None and now - arrived > STALL_AFTER_S:
                    state.stalled = True
                    state.stalls += 1

    def add_tick(self, tick: Any) -> None:
        """One node sampler tick (workers.wire.telemetry.Tick): link rates integrate into bytes."""
        with self.lock:
            dt = (tick.t_ns - self._last_tick_ns) * 1e-9 if self._last_tick_ns else 0.0
            self._last_tick_ns = tick.t_ns
            for i, uuid in enumerate(tick.uuids):
                gpu = self.gpus.get(i)
                if gpu is None or gpu.uuid != uuid:
                    gpu = self.gpus[i] = GpuState(uuid)
                for link in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"):
                    gbps = float(tick.metrics[f"{link}_gbps"][i])
                    if math.isfinite(gbps):
                        gpu.link_bytes[link] = gpu.link_bytes.get(link, 0.0) + gbps * 1e9 * min(dt, 10.0)
                for name, scale, metric in (
                    ("sm_clock_hertz", 1e6, "sm_clock_mhz"),
                    ("power_watts", 1.0, "power_w"),
                    ("power_limit_watts", 1.0, "power_limit_w"),
                ):
                    value = float(tick.metrics[metric][i])
                    if math.isfinite(value):
                        gpu.gauges[name] = value * scale
                reasons = float(tick.metrics["throttle_reasons"][i])
                if math.isfinite(reasons):
                    gpu.throttle = int(reasons)

    # ------------------------------------------------------------------ output

    def families(self) -> Iterator[Any]:
        """prometheus_client metric families from a consistent copy (the lock is held only to copy)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        now = self.clock()
        with self.lock:
            coll = {k: (h.buckets.copy(), h.sum_s, h.bytes, h.bus_bytes, h.last_busbw) for k, h in self.coll.items()}
            copy = {k: (h.buckets.copy(), h.sum_s, h.bytes) for k, h in self.copy.items()}
            ranks = {
                r: (
                    s.epoch,
                    s.last_record_s,
                    s.lost_batches,
                    s.collector_dropped,
                    s.stalls,
                    s.straggler,
                    s.inside[0] + (now - s.inside[1]) if s.inside is not None else 0.0,
                )
                for r, s in self.ranks.items()
            }
            gpus = {i: (g.uuid, dict(g.link_bytes), dict(g.gauges), g.throttle) for i, g in self.gpus.items()}
            rejected = dict(self.rejected)
            records = self.records
        bounds = [_le(b) for b in BUCKETS_S] + ["+Inf"]

        def hist_buckets(counts: np.ndarray) -> list[tuple[str, float]]:
            return list(zip(bounds, np.cumsum(counts).tolist(), strict=True))

        dur = HistogramMetricFamily(
            "commtop_collective_duration_seconds",
            "Collective latency per rank (CUDA events on GPU, host clock on CPU)",
            labels=COLL_LABELS,
        )
        nbytes = CounterMetricFamily(
            "commtop_collective_bytes", "Bytes of the collectives (nccl-tests S)", labels=COLL_LABELS
        )
        bus = CounterMetricFamily(
            "commtop_collective_bus_bytes",
            "busbw x duration summed: rate(this) / rate(duration_seconds_sum) is the time-weighted bus bandwidth",
            labels=COLL_LABELS,
        )
        busbw = GaugeMetricFamily(
            "commtop_collective_busbw_bytes_per_second",
            "Median bus bandwidth (nccl-tests busbw) of the latest batch",
            labels=COLL_LABELS,
        )
        for (rank, op, size, mode), (counts, sum_s, b, bb, last) in sorted(coll.items()):
            labels = [str(rank), _name(protocol.OP_NAMES, op), size_label(size), _name(protocol.MODES, mode)]
            dur.add_metric(labels, hist_buckets(counts), sum_s)
            nbytes.add_metric(labels, float(b))
            bus.add_metric(labels, bb)
            if math.isfinite(last):
                busbw.add_metric(labels, last)
        yield from (dur, nbytes, bus, busbw)

        cdur = HistogramMetricFamily(
            "commtop_copy_duration_seconds", "Offload copy duration per rank", labels=COPY_LABELS
        )
        cbytes = CounterMetricFamily("commtop_copy_bytes", "Bytes copied between device and host", labels=COPY_LABELS)
        for (rank, direction, pinned), (counts, sum_s, b) in sorted(copy.items()):
            labels = [str(rank), _name(protocol.DIRECTIONS, direction), "true" if pinned else "false"]
            cdur.add_metric(labels, hist_buckets(counts), sum_s)
            cbytes.add_metric(labels, float(b))
        yield from (cdur, cbytes)

        per_rank = (
            ("commtop_rank_settings_epoch", "gauge", "Settings epoch in force (changes when the mode is switched)", 0),
            ("commtop_rank_last_record_timestamp_seconds", "gauge", "Wall clock of the rank's latest collective", 1),
            ("commtop_rank_lost_batches", "counter", "Record batches of the rank this exporter never got", 2),
            ("commtop_rank_dropped_records", "counter", "Records the rank could not queue for the collector", 3),
            ("commtop_rank_stalls", "counter", f"Times the rank's records stopped for over {STALL_AFTER_S:g} s", 4),
            (
                "commtop_rank_straggler_iterations",
                "counter",
                "Iterations this rank arrived last of its node while it was clearly the node's straggler "
                "(no more once the node's ranks order their collectives differently: threads)",
                5,
            ),
            (
                "commtop_rank_inside_collective_seconds",
                "gauge",
                "How long the rank has been inside its oldest unfinished collective (0: none; a hang grows it)",
                6,
            ),
        )
        for name, kind, doc, idx in per_rank:
            fam = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=["rank"])
            for rank, values in sorted(ranks.items()):
                fam.add_metric([str(rank)], float(values[idx]))
            yield fam

        links = {
            link: CounterMetricFamily(
                f"commtop_gpu_{link}_bytes", f"{link.replace('_', ' ')} bytes (NVML)", labels=GPU_LABELS
            )
            for link in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")
        }
        gauges = {
            "sm_clock_hertz": GaugeMetricFamily("commtop_gpu_sm_clock_hertz", "SM clock", labels=GPU_LABELS),
            "power_watts": GaugeMetricFamily("commtop_gpu_power_watts", "Power draw", labels=GPU_LABELS),
            "power_limit_watts": GaugeMetricFamily("commtop_gpu_power_limit_watts", "Power limit", labels=GPU_LABELS),
        }
        throttle = GaugeMetricFamily(
            "commtop_gpu_throttle_reason",
            "1 while NVML reports this clocks-event (throttle) reason",
            labels=[*GPU_LABELS, "reason"],
        )
        for index, (uuid, link_bytes, gauge_values, reasons) in sorted(gpus.items()):
            labels = [str(index), uuid]
            for link, value in link_bytes.items():
                links[link].add_metric(labels, value)
            for name, gauge in gauge_values.items():
                gauges[name].add_metric(labels, gauge)
            if reasons >= 0:
                for bit, reason in THROTTLE_REASONS:
                    throttle.add_metric([*labels, reason], 1.0 if reasons & bit else 0.0)
        yield from links.values()
        yield from gauges.values()
        yield throttle

        rej = CounterMetricFamily(
            "commtop_exporter_rejected_messages",
            "Messages refused (bad signature, other session...)",
            labels=["reason"],
        )
        for reason, n in sorted(rejected.items()):
            rej.add_metric([reason], float(n))
        yield rej
        yield CounterMetricFamily("commtop_exporter_records", "Records this exporter took in", value=float(records))


class Collector:
    """prometheus_client's custom-collector protocol over a :class:`NodeMetrics`."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        return self.metrics.families()


def _name(names: tuple[str, ...], index: int) -> str:
    return names[index] if 0 <= index < len(names) else "other"


def _le(bound: float) -> str:
    return f"{bound:.6g}"
