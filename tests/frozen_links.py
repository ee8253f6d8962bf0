"""Test-only telemetry for frozen runs: the ticks commtop's sampler recorded on the H200
(tests/fixtures/nvml/h200_nvml.json), moved onto a frozen run's clock and host, and copied
onto more GPUs where a test needs 8 (the copies are named fakes: same H200 readings, each
GPU's ticks shifted in phase so the rows differ; NVLink figures, where asked for, are made up).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from workers.wire.telemetry import Caps, GpuCaps, ProcInfo, Tick

FIXTURE = Path(__file__).parent / "fixtures" / "nvml" / "h200_nvml.json"
PHASES = ("d2h", "idle", "h2d", "idle")


def gpu_uuid(i: int) -> str:
    """The H200's UUID for GPU 0, made-up ones for the fake copies."""
    if i == 0:
        return json.loads(FIXTURE.read_text())["sampler"]["uuids"][0]
    return f"GPU-fake-{i:04d}"


def fixture_ticks(host: str, end_ns: int, gpus: int = 1, *, nvlink: bool = False) -> list[Any]:
    """Caps, then the H200's d2h / idle / h2d / idle ticks back to back (10 Hz), the last at
    ``end_ns``, for ``gpus`` GPUs of ``host``."""
    cap = json.loads(FIXTURE.read_text())
    s = cap["sampler"]
    rows = [t for phase in PHASES for t in s[phase]]
    uuids = tuple(gpu_uuid(i) for i in range(gpus))
    step = 100_000_000
    t0 = end_ns - (len(rows) - 1) * step
    ticks: list[Any] = []
    for i in range(len(rows)):
        metrics: dict[str, np.ndarray] = {}
        for name in rows[0]["metrics"]:
            # GPU g reads what GPU 0 read 3*g ticks earlier (fake copies, so rows differ).
            vals = [rows[(i - 3 * g) % len(rows)]["metrics"][name][0] for g in range(gpus)]
            metrics[name] = np.array([math.nan if v is None else v for v in vals], dtype=np.float64)
        if nvlink:  # made-up NVLink traffic: a fraction of the PCIe figures
            metrics["nvlink_tx_gbps"] = np.nan_to_num(metrics["pcie_tx_gbps"]) * 4.0 + 20.0
            metrics["nvlink_rx_gbps"] = np.nan_to_num(metrics["pcie_rx_gbps"]) * 4.0 + 20.0
        t = rows[i]
        ticks.append(
            Tick(
                host=host,
                pid=1,
                seq=i,
                t_ns=t0 + i * step,
                cost_us=t["cost_us"],
                uuids=uuids,
                metrics=metrics,
                gpu_cost_us=np.full(gpus, t["gpu_cost_us"][0]),
                pcie_peak_gbps=np.full(gpus, t["pcie_peak_gbps"][0]),
                nvlink_peak_gbps=np.full(gpus, 450.0 if nvlink else math.nan),
                cpu_pct=t["cpu_pct"],
                mem_used_bytes=2 << 30,
                mem_total_bytes=126 << 30,
                procs=(ProcInfo(1000, "running", 99.0, 1 << 30),),
            )
        )
    g0 = s["caps"]["gpus"][0]
    na = {k: v for k, v in g0["na"].items() if not (nvlink and k.startswith("nvlink"))}
    caps = Caps(
        host,
        1,
        t0,
        0.1,
        s["caps"]["nvml"],
        cap["driver"]["ok"],
        tuple(
            GpuCaps(
                uuids[i],
                i,
                "NVIDIA H200",
                5,
                16,
                g0["pcie_peak"],
                18 if nvlink else 0,
                450.0 if nvlink else math.nan,
                g0["sources"],
                na,
            )
            for i in range(gpus)
        ),
        tuple(s["caps"]["notes"]),
    )
    return [caps, *ticks]
