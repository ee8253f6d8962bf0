"""HBM bandwidth utilisation (GPM DRAM_BW_UTIL) through commtop's own sampler code path
(workers.telemetry.gpu.GpuProbe.read, 10 Hz as the node sampler runs it) on GPU 0: idle, during
pinned D2H copies (PCIe), and during device-to-device copies (HBM-heavy). Prints one JSON object
per phase (median and max per metric) and the machine. Needs a GPU with GPM (Hopper+).

    python3 benchmarks/probes/hbm_probe.py [--seconds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch

from workers.telemetry import nvml
from workers.telemetry.gpu import GpuProbe
from workers.telemetry.nvml import NA

METRICS = ("dram_bw_util_pct", "pcie_tx_gbps", "pcie_rx_gbps", "sm_clock_mhz", "mem_clock_mhz", "power_w")


def load(kind: str, stop: threading.Event) -> None:
    dev = torch.device("cuda", 0)
    if kind == "d2h":
        src = torch.empty(64 << 20, dtype=torch.bfloat16, device=dev)  # 128 MiB
        dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    else:
        src = torch.empty(512 << 20, dtype=torch.bfloat16, device=dev)  # 1 GiB
        dst = torch.empty_like(src)
    while not stop.is_set():
        for _ in range(8):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()


def phase(probe: GpuProbe, kind: str, seconds: float) -> dict[str, object]:
    stop = threading.Event()
    worker = None if kind == "idle" else threading.Thread(target=load, args=(kind, stop), daemon=True)
    if worker is not None:
        worker.start()
        time.sleep(0.5)  # let the load settle
    readings: dict[str, list[float]] = {m: [] for m in METRICS}
    costs = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        values = probe.read()
        costs.append((time.perf_counter() - t0) * 1e3)
        for m in METRICS:
            v = values.get(m)
            if v is not None and not isinstance(v, NA):
                readings[m].append(float(v))
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - t0)))
    stop.set()
    if worker is not None:
        worker.join()
    out: dict[str, object] = {"phase": kind, "ticks": len(costs), "read_ms_median": statistics.median(costs)}
    for m, vals in readings.items():
        out[m] = {"median": statistics.median(vals), "max": max(vals)} if vals else "n/a"
    out["na"] = {k: str(v) for k, v in probe.last_na.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default="")
    ns = ap.parse_args()
    torch.cuda.init()
    handle = nvml.query(nvml.pynvml.nvmlDeviceGetHandleByIndex, 0) if nvml.init() is None else None
    if handle is None or isinstance(handle, NA):
        raise SystemExit(f"no NVML GPU: {handle}")
    probe = GpuProbe(handle, 0.1)
    doc = {
        "machine": f"{probe.name} ({torch.cuda.get_device_name(0)}), torch {torch.__version__}",
        "sources": probe.sources,
        "notes": probe.notes,
        "phases": [phase(probe, kind, ns.seconds) for kind in ("idle", "d2h", "d2d", "idle")],
    }
    probe.close()
    text = json.dumps(doc, indent=1)
    print(text)
    if ns.out:
        with open(ns.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
