"""The node sampler: one per node, a separate process, never on a hot path.

:class:`NodeSampler` produces :class:`~workers.wire.telemetry.Tick` records in-process
(the H200 capture script runs it that way); :func:`run` drives it at 10 Hz and pushes
signed TELEM ticks and once-a-second TELEM_CAPS to the collector, dropping (and counting)
whatever the collector cannot take right now.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from workers.telemetry import nvml
from workers.telemetry.gpu import GpuProbe, ThroughputThread
from workers.telemetry.host import HostProbe
from workers.telemetry.nvml import NA
from workers.wire import protocol
from workers.wire.telemetry import Caps, GpuCaps, Tick, caps_body, tick_body

log = logging.getLogger("commtop.telemetry")
INTERVAL_S = 0.1
CAPS_EVERY_S = 1.0
SNDHWM = 64


def _open_handles(uuids: list[str]) -> tuple[list[Any], list[str]]:
    """NVML handles for the given UUIDs (all devices when none are given), and notes."""
    mod = nvml.pynvml
    notes: list[str] = []
    # several ranks may share a GPU; torch spells UUIDs without NVML's "GPU-" prefix
    uuids = list(dict.fromkeys(u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}" for u in uuids))
    if not uuids:
        count = nvml.query(mod.nvmlDeviceGetCount)
        if isinstance(count, NA):
            return [], [f"device count: {count}"]
        handles = [nvml.query(mod.nvmlDeviceGetHandleByIndex, i) for i in range(int(count))]
    else:
        handles = [nvml.query(mod.nvmlDeviceGetHandleByUUID, u) for u in uuids]
    out = []
    for i, h in enumerate(handles):
        if isinstance(h, NA):
            notes.append(f"GPU {uuids[i] if uuids else i}: {h}")
        else:
            out.append(h)
    return out, notes


class NodeSampler:
    """Samples every given GPU and the host; each :meth:`tick` measures its own cost."""

    def __init__(
        self, gpu_uuids: list[str], interval_s: float = INTERVAL_S, parent_pid: int | None = None, use_gpm: bool = True
    ) -> None:
        """``use_gpm=False`` forces the fallback sources (the H200 capture exercises them)."""
        self.interval_s = interval_s
        self.host = os.environ.get("COMMTOP_HOSTNAME") or socket.gethostname()  # heartbeat.HOSTNAME_ENV
        self.seq = 0
        self.dropped = 0
        self.host_probe = HostProbe(parent_pid)
        self.gpus: list[GpuProbe] = []
        self.notes: list[str] = []
        self.throughput: ThroughputThread | None = None
        failed = nvml.init()
        self.nvml_reason = "" if failed is None else failed.reason
        self.driver = ""
        if failed is not None:
            self.notes.append(f"{failed.reason}: {failed.detail}" if failed.detail else failed.reason)
            return
        driver = nvml.query(nvml.pynvml.nvmlSystemGetDriverVersion)
        self.driver = "" if isinstance(driver, NA) else str(driver)
        handles, notes = _open_handles(gpu_uuids)
        self.notes.extend(notes)
        self.gpus = [GpuProbe(h, interval_s, use_gpm) for h in handles]
        slow = [g for g in self.gpus if g.needs_throughput_thread]
        if slow:
            self.throughput = ThroughputThread([g.handle for g in slow])
            for slot, g in enumerate(slow):
                g.throughput, g.throughput_slot = self.throughput, slot

    def tick(self) -> Tick:
        start = time.perf_counter()
        n = len(self.gpus)
        metrics = {name: np.full(n, np.nan) for name in (*protocol.TELEM_GPU_METRICS, *protocol.TELEM_GPU_OPTIONAL)}
        gpu_cost = np.zeros(n)
        pcie_peak = np.full(n, np.nan)
        nvl_peak = np.full(n, np.nan)
        for i, gpu in enumerate(self.gpus):
            t0 = time.perf_counter()
            values = gpu.read()
            gpu_cost[i] = (time.perf_counter() - t0) * 1e6
            for name, value in values.items():
                if name in metrics and not isinstance(value, NA):
                    metrics[name][i] = value
            pcie_peak[i], nvl_peak[i] = gpu.peaks()
        cpu, used, total, procs = self.host_probe.read()
        tick = Tick(
            host=self.host,
            pid=os.getpid(),
            seq=self.seq,
            t_ns=time.time_ns(),
            cost_us=(time.perf_counter() - start) * 1e6,
            uuids=tuple(g.uuid for g in self.gpus),
            metrics=metrics,
            gpu_cost_us=gpu_cost,
            pcie_peak_gbps=pcie_peak,
            nvlink_peak_gbps=nvl_peak,
            cpu_pct=cpu,
            mem_used_bytes=used,
            mem_total_bytes=total,
            procs=procs,
            nvml=self.nvml_reason,
            dropped=self.dropped,
        )
        self.seq += 1
        return tick

    def caps(self) -> Caps:
        gpus = []
        for g in self.gpus:
            pcie, nvl = g.peaks()
            na = {m: (f"{v.reason} ({v.detail})" if v.detail else v.reason) for m, v in g.last_na.items()}
            gpus.append(
                GpuCaps(
                    uuid=g.uuid,
                    index=g.index,
                    name=g.name,
                    pcie_gen=g.pcie_gen,
                    pcie_width=g.pcie_width,
                    pcie_peak_gbps=pcie if math.isfinite(pcie) else math.nan,
                    nvlink_links=g.nvlink_links,
                    nvlink_peak_gbps=nvl,
                    sources=dict(g.sources),
                    na=na,
                )
            )
        notes = list(self.notes) + [n for g in self.gpus for n in g.notes]
        return Caps(
            host=self.host,
            pid=os.getpid(),
            t_ns=time.time_ns(),
            interval_s=self.interval_s,
            nvml=self.nvml_reason,
            driver=self.driver,
            gpus=tuple(gpus),
            notes=tuple(notes),
        )

    def close(self) -> None:
        if self.throughput is not None:
            self.throughput.stop()
        for g in self.gpus:
            g.close()


def sample_for(sampler: NodeSampler, seconds: float) -> list[Tick]:
    """Tick at the sampler's interval for ``seconds``, in-process (benchmarks, capture)."""
    ticks: list[Tick] = []
    deadline = time.perf_counter()
    end = deadline + seconds
    while time.perf_counter() < end:
        ticks.append(sampler.tick())
        deadline += sampler.interval_s
        time.sleep(max(0.0, deadline - time.perf_counter()))
    return ticks


def run(connection: Any, gpu_uuids: list[str], interval_s: float = INTERVAL_S, prometheus: str = "") -> int:
    """Sample and push until the parent dies or SIGTERM/SIGINT arrives; returns an exit code.
    ``prometheus`` ([HOST:]PORT): also serve this node's ranks and ticks there (workers.export)."""
    import zmq  # only the live sampler needs pyzmq (the H200 capture runs without it)

    stop = {"flag": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    parent = os.getppid()
    sampler = NodeSampler(gpu_uuids, interval_s, parent_pid=parent)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, SNDHWM)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(connection.data)
    key, session = connection.key, connection.session
    exporter = None
    if prometheus:
        from workers.export.server import NodeExporter

        try:
            exporter = NodeExporter(connection, sampler.host, prometheus)
        except (OSError, zmq.ZMQError) as exc:  # port in use, ...: telemetry goes on without it
            print(f"commtop: prometheus endpoint {prometheus} not started: {exc}", file=sys.stderr, flush=True)

    def send(body: dict[str, Any]) -> bool:
        try:
            sock.send_multipart(protocol.seal(key, body), flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    next_caps = 0.0
    errors = 0
    deadline = time.monotonic()
    try:
        while not stop["flag"] and os.getppid() == parent:
            try:
                tick = sampler.tick()
                if not send(tick_body(session, tick)):
                    sampler.dropped += 1
                if exporter is not None:
                    exporter.metrics.add_tick(tick)
                now = time.monotonic()
                if now >= next_caps:
                    caps = sampler.caps()
                    if exporter is not None:  # the collector lists every node's endpoint (`commtop ctl status`)
                        caps = replace(caps, prometheus=exporter.url)
                    send(caps_body(session, caps))
                    next_caps = now + CAPS_EVERY_S
            except Exception:  # one bad tick (a driver hiccup) must not end the node's telemetry
                errors += 1
                if errors <= 3:
                    log.exception("telemetry tick failed")
                now = time.monotonic()
            deadline += interval_s
            if deadline < now:  # fell behind (suspended, slow NVML): do not burst to catch up
                deadline = now
            time.sleep(max(0.0, deadline - time.monotonic()))
        if exporter is not None and not stop["flag"]:
            exporter.linger(lambda: stop["flag"])
    finally:
        if exporter is not None:
            exporter.close()
            # The collector lists the endpoint in `ctl status` until told it closed.
            with contextlib.suppress(Exception):
                send(caps_body(session, replace(sampler.caps(), prometheus="")))
        sampler.close()
        sock.close(100)  # ms for that last word; nothing waits where the collector is gone (IMMEDIATE)
        nvml.shutdown()
    return 0
