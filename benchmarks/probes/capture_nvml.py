#!/usr/bin/env python3
"""Capture real NVML readings on a GPU machine for commtop's telemetry tests and report.

Usage: python3 benchmarks/probes/capture_nvml.py OUTFILE.json  (needs torch, pynvml, psutil, numpy)

Phases (per GPU, a sample every ~100 ms): idle; a continuous pinned D2H copy stream of
128 MiB bf16 on a side stream of GPU 0 (timed with CUDA events); a burst of fast PCIe-counter
reads (every ~5 ms) during the copy, so counter-wrap handling is tested on real wraps; then
commtop's own NodeSampler in-process during D2H, H2D and idle, with its cost per tick.
Every call is wrapped: the script never stops halfway and always writes the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCHEMA = 1
SAMPLE_S = 0.1
COPY_BYTES = 128 << 20
ALL_LINKS = 0xFFFFFFFF
GPM_IDS = (20, 21, 60, 61)  # PCIe TX, PCIe RX, NVLink total RX, NVLink total TX (MiB/s)
PCIE_FIELDS = ((197, 0), (198, 0))
NVLINK_FIELDS = ((138, ALL_LINKS), (139, ALL_LINKS), (138, 0), (139, 0), (90, 0))

errors: list[str] = []


def err(where: str, exc: BaseException) -> dict[str, Any]:
    code = getattr(exc, "value", None)
    msg = f"{where}: {type(exc).__name__}: {exc}"
    if len(errors) < 500:
        errors.append(msg)
    return {"err": str(exc)[:300], "type": type(exc).__name__, "code": code if isinstance(code, int) else None}


def call(nv: Any, name: str, *args: Any) -> dict[str, Any]:
    """Call pynvml.<name>(*args): {"ok": value, "ms": t} or {"err": ..., "code": ..., "ms": t}."""
    t0 = time.perf_counter()
    try:
        value = getattr(nv, name)(*args)
        out = {"ok": plain(value)}
    except Exception as exc:
        code = getattr(exc, "value", None)
        out = {"err": str(exc)[:300], "code": code if isinstance(code, int) else None}
    out["ms"] = (time.perf_counter() - t0) * 1e3
    return out


def plain(value: Any) -> Any:
    """JSON-safe copy of an NVML return value (ctypes structs become dicts)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    fields = getattr(value, "_fields_", None)
    if fields:
        return {f[0]: plain(getattr(value, f[0], None)) for f in fields if not f[0].startswith("_")}
    return repr(value)[:200]


def field_values(nv: Any, handle: Any, ids: tuple[Any, ...]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        values = nv.nvmlDeviceGetFieldValues(handle, list(ids))
    except Exception as exc:
        out = err("nvmlDeviceGetFieldValues", exc)
        out["ms"] = (time.perf_counter() - t0) * 1e3
        return out
    ms = (time.perf_counter() - t0) * 1e3
    rows = []
    for fv in values:
        vt = int(fv.valueType)
        u = fv.value
        value = {0: u.dVal, 1: u.uiVal, 2: u.ulVal, 3: u.ullVal, 4: u.sllVal, 5: u.siVal, 6: u.usVal}.get(vt)
        rows.append(
            {
                "field": int(fv.fieldId),
                "scope": int(fv.scopeId),
                "ret": int(fv.nvmlReturn),
                "vt": vt,
                "value": plain(value),
                "ts_us": int(fv.timestamp),
                "lat_us": int(fv.latencyUsec),
            }
        )
    return {"ok": rows, "ms": ms}


class Gpm:
    """Two alternating GPM samples per GPU; metrics between the previous and the current one."""

    def __init__(self, nv: Any, handle: Any) -> None:
        self.nv, self.handle = nv, handle
        self.samples: list[Any] = []
        self.error = ""
        try:
            self.samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            nv.nvmlGpmSampleGet(handle, self.samples[0])
            self.prev_t = time.perf_counter()
        except Exception as exc:
            self.error = err("gpm alloc/first sample", exc)["err"]
            self.samples = []

    def step(self) -> dict[str, Any]:
        if not self.samples:
            return {"err": self.error or "GPM unavailable"}
        nv = self.nv
        prev, cur = self.samples
        out: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            nv.nvmlGpmSampleGet(self.handle, cur)
        except Exception as exc:
            return err("nvmlGpmSampleGet", exc)
        now = time.perf_counter()
        out["sample_ms"] = (now - t0) * 1e3
        out["dt_s"] = now - self.prev_t
        t1 = time.perf_counter()
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_IDS)
            mg.sample1 = prev
            mg.sample2 = cur
            for i, mid in enumerate(GPM_IDS):
                mg.metrics[i].metricId = mid
            res = nv.nvmlGpmMetricsGet(mg)
            out["metrics"] = [
                [int(res.metrics[i].metricId), int(res.metrics[i].nvmlReturn), plain(float(res.metrics[i].value))]
                for i in range(len(GPM_IDS))
            ]
        except Exception as exc:
            out["metrics_err"] = err("nvmlGpmMetricsGet", exc)
        out["metrics_ms"] = (time.perf_counter() - t1) * 1e3
        self.samples = [cur, prev]
        self.prev_t = now
        return out

    def free(self) -> None:
        for s in self.samples:
            try:
                self.nv.nvmlGpmSampleFree(s)
            except Exception as exc:
                err("nvmlGpmSampleFree", exc)


def static_info(nv: Any, handle: Any) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for key, name in (
        ("index", "nvmlDeviceGetIndex"),
        ("uuid", "nvmlDeviceGetUUID"),
        ("name", "nvmlDeviceGetName"),
        ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
        ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
        ("pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
        ("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
        ("gpm_support", "nvmlGpmQueryDeviceSupport"),
        ("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit"),
    ):
        info[key] = call(nv, name, handle)
    links = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        links.append(call(nv, "nvmlDeviceGetNvLinkState", handle, link))
    info["nvlink_states"] = links
    info["nvlink_fields"] = field_values(nv, handle, NVLINK_FIELDS)
    return info


def sample(nv: Any, handle: Any, gpm: Gpm, with_throughput: bool) -> dict[str, Any]:
    s: dict[str, Any] = {"t_ns": time.time_ns(), "t_perf": time.perf_counter()}
    s["gpm"] = gpm.step()
    s["fields_pcie"] = field_values(nv, handle, PCIE_FIELDS)
    s["fields_nvlink"] = field_values(nv, handle, NVLINK_FIELDS[:2])
    if with_throughput:
        s["pcie_throughput_tx"] = call(nv, "nvmlDeviceGetPcieThroughput", handle, 0)
        s["pcie_throughput_rx"] = call(nv, "nvmlDeviceGetPcieThroughput", handle, 1)
    s["sm_clock"] = call(nv, "nvmlDeviceGetClockInfo", handle, 1)
    s["mem_clock"] = call(nv, "nvmlDeviceGetClockInfo", handle, 2)
    s["power_mw"] = call(nv, "nvmlDeviceGetPowerUsage", handle)
    s["power_limit_mw"] = call(nv, "nvmlDeviceGetEnforcedPowerLimit", handle)
    name = "nvmlDeviceGetCurrentClocksEventReasons"
    s["clock_events"] = call(nv, name if hasattr(nv, name) else "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    s["util"] = call(nv, "nvmlDeviceGetUtilizationRates", handle)
    s["memory"] = call(nv, "nvmlDeviceGetMemoryInfo", handle)
    s["replay"] = call(nv, "nvmlDeviceGetPcieReplayCounter", handle)
    s["pcie_gen"] = call(nv, "nvmlDeviceGetCurrPcieLinkGeneration", handle)
    s["pcie_width"] = call(nv, "nvmlDeviceGetCurrPcieLinkWidth", handle)
    return s


class CopyStream:
    """Continuous 128 MiB bf16 copies between GPU 0 and pinned host memory on a side stream,
    each timed with CUDA events (never more than 4 in flight)."""

    def __init__(self, torch: Any, direction: str) -> None:
        self.torch = torch
        self.direction = direction
        n = COPY_BYTES // 2
        self.dev = torch.ones(n, dtype=torch.bfloat16, device="cuda:0")
        self.host = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
        self.stream = torch.cuda.Stream(device=0)
        self.ms: list[float] = []
        self.t_ns: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error = ""

    def _run(self) -> None:
        torch = self.torch
        pending: deque[tuple[Any, Any, int]] = deque()
        try:
            with torch.cuda.stream(self.stream):
                while not self._stop.is_set() or pending:
                    if not self._stop.is_set():
                        a = torch.cuda.Event(enable_timing=True)
                        b = torch.cuda.Event(enable_timing=True)
                        a.record(self.stream)
                        if self.direction == "d2h":
                            self.host.copy_(self.dev, non_blocking=True)
                        else:
                            self.dev.copy_(self.host, non_blocking=True)
                        b.record(self.stream)
                        pending.append((a, b, time.time_ns()))
                    if len(pending) >= 4 or (self._stop.is_set() and pending):
                        a, b, t = pending.popleft()
                        b.synchronize()
                        self.ms.append(a.elapsed_time(b))
                        self.t_ns.append(t)
        except Exception as exc:
            self.error = err(f"copy stream {self.direction}", exc)["err"]

    def __enter__(self) -> CopyStream:
        self._thread.start()
        time.sleep(0.3)  # reach steady state before sampling
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict[str, Any]:
        ms = self.ms[2:] if len(self.ms) > 4 else self.ms
        if not ms:
            return {"direction": self.direction, "copies": 0, "error": self.error}
        mean = sum(ms) / len(ms)
        srt = sorted(ms)
        return {
            "direction": self.direction,
            "bytes": COPY_BYTES,
            "copies": len(ms),
            "ms_mean": mean,
            "ms_median": srt[len(srt) // 2],
            "gbps_mean": COPY_BYTES / (mean * 1e-3) / 1e9,
            "gbps_median": COPY_BYTES / (srt[len(srt) // 2] * 1e-3) / 1e9,
            "ms": ms[:400],
            "error": self.error,
        }


def raw_phase(nv: Any, handles: list[Any], gpms: list[Gpm], seconds: float) -> list[list[dict[str, Any]]]:
    per_gpu: list[list[dict[str, Any]]] = [[] for _ in handles]
    end = time.perf_counter() + seconds
    k = 0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for i, h in enumerate(handles):
            per_gpu[i].append(sample(nv, h, gpms[i], with_throughput=(i == 0 or k % 4 == 0)))
        k += 1
        time.sleep(max(0.0, SAMPLE_S - (time.perf_counter() - t0)))
    return per_gpu


def fast_fields(nv: Any, handle: Any, seconds: float) -> list[dict[str, Any]]:
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(field_values(nv, handle, PCIE_FIELDS))
        time.sleep(0.005)
    return out


def sampler_phase(sampler: Any, seconds: float) -> list[dict[str, Any]]:
    from workers.telemetry.sampler import sample_for

    ticks = sample_for(sampler, seconds)
    out = []
    for t in ticks:
        out.append(
            {
                "t_ns": t.t_ns,
                "cost_us": t.cost_us,
                "gpu_cost_us": [plain(float(x)) for x in t.gpu_cost_us],
                "metrics": {k: [plain(float(x)) for x in v] for k, v in t.metrics.items()},
                "pcie_peak_gbps": [plain(float(x)) for x in t.pcie_peak_gbps],
                "cpu_pct": plain(float(t.cpu_pct)),
                "procs": len(t.procs),
            }
        )
    return out


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None and math.isfinite(x))
    return xs[len(xs) // 2] if xs else None


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    copy = doc.get("copy", {})
    sampler = doc.get("sampler", {})
    for direction, metric in (("d2h", "pcie_tx_gbps"), ("h2d", "pcie_rx_gbps")):
        event = copy.get(f"{direction}_sampler", {}).get("gbps_mean")
        ticks = sampler.get(direction, [])[2:]
        got = median([t["metrics"][metric][0] for t in ticks if t["metrics"].get(metric)])
        s[f"{direction}_copy_gbps_cuda_events"] = event
        s[f"{direction}_commtop_{metric}"] = got
        if event and got:
            s[f"{direction}_commtop_vs_events_pct"] = 100.0 * (got - event) / event
    fb = sampler.get("d2h_fallback", [])[3:]
    s["d2h_fallback_commtop_pcie_tx_gbps"] = median([t["metrics"]["pcie_tx_gbps"][0] for t in fb])
    s["d2h_fallback_tick_cost_ms_median"] = median([t["cost_us"] / 1e3 for t in fb])
    s["fallback_sources"] = sampler.get("caps_fallback", {})
    costs = [t["cost_us"] for ph in ("d2h", "h2d", "idle") for t in sampler.get(ph, [])[1:]]
    per_gpu = [c for ph in ("d2h", "h2d", "idle") for t in sampler.get(ph, [])[1:] for c in t["gpu_cost_us"]]
    if costs:
        srt = sorted(costs)
        s["tick_cost_ms_median"] = srt[len(srt) // 2] / 1e3
        s["tick_cost_ms_p95"] = srt[int(0.95 * (len(srt) - 1))] / 1e3
        s["tick_cost_ms_max"] = srt[-1] / 1e3
    if per_gpu:
        srt = sorted(per_gpu)
        s["gpu_cost_ms_median"] = srt[len(srt) // 2] / 1e3
        s["gpu_cost_ms_p95"] = srt[int(0.95 * (len(srt) - 1))] / 1e3
    s["sources"] = doc.get("sampler", {}).get("caps", {})
    return s


def capture(doc: dict[str, Any]) -> None:
    import pynvml as nv

    doc["pynvml_file"] = getattr(nv, "__file__", "")
    nv.nvmlInit()
    doc["driver"] = call(nv, "nvmlSystemGetDriverVersion")
    doc["nvml_version"] = call(nv, "nvmlSystemGetNVMLVersion")
    doc["cuda_driver_version"] = call(nv, "nvmlSystemGetCudaDriverVersion")
    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    doc["gpus"] = [static_info(nv, h) for h in handles]
    gpms = [Gpm(nv, h) for h in handles]
    doc["phases"] = {}
    try:
        import torch

        doc["torch"] = torch.__version__
        doc["cuda"] = torch.version.cuda
        has_cuda = torch.cuda.is_available()
    except Exception as exc:
        err("import torch", exc)
        torch, has_cuda = None, False
    doc["phases"]["idle"] = raw_phase(nv, handles, gpms, 1.5)
    doc["copy"] = {}
    if has_cuda:
        try:
            with CopyStream(torch, "d2h") as cs:
                doc["phases"]["d2h"] = raw_phase(nv, handles, gpms, 1.5)
                doc["fast_fields_d2h"] = fast_fields(nv, handles[0], 0.4)
            doc["copy"]["d2h"] = cs.summary()
        except Exception as exc:
            err("d2h phase", exc)
    # commtop's own sampler, in-process
    sampler = None
    try:
        from workers.telemetry.sampler import NodeSampler

        uuids = [g["uuid"].get("ok") for g in doc["gpus"] if g["uuid"].get("ok")]
        sampler = NodeSampler(uuids, parent_pid=os.getpid())
        doc["sampler"] = {"uuids": uuids}
        if has_cuda:
            for direction in ("d2h", "h2d"):
                try:
                    with CopyStream(torch, direction) as cs:
                        doc["sampler"][direction] = sampler_phase(sampler, 2.0)
                    doc["copy"][f"{direction}_sampler"] = cs.summary()
                except Exception as exc:
                    err(f"sampler {direction}", exc)
        time.sleep(0.5)
        doc["sampler"]["idle"] = sampler_phase(sampler, 1.0)
        if has_cuda:  # the fallback sources (no GPM): counters are refused, PcieThroughput thread
            fallback = None
            try:
                fallback = NodeSampler(uuids, parent_pid=os.getpid(), use_gpm=False)
                with CopyStream(torch, "d2h") as cs:
                    time.sleep(0.3)  # the throughput thread's first readings
                    doc["sampler"]["d2h_fallback"] = sampler_phase(fallback, 1.5)
                doc["copy"]["d2h_fallback"] = cs.summary()
                fcaps = fallback.caps()
                doc["sampler"]["caps_fallback"] = {
                    "notes": list(fcaps.notes),
                    "gpus": [{"uuid": g.uuid, "sources": g.sources, "na": g.na} for g in fcaps.gpus],
                }
            except Exception as exc:
                err("fallback sampler", exc)
            finally:
                if fallback is not None:
                    fallback.close()
        caps = sampler.caps()
        doc["sampler"]["caps"] = {
            "nvml": caps.nvml,
            "notes": list(caps.notes),
            "gpus": [
                {"uuid": g.uuid, "sources": g.sources, "na": g.na, "pcie_peak": g.pcie_peak_gbps} for g in caps.gpus
            ],
        }
    except Exception as exc:
        err("commtop sampler", exc)
        doc.setdefault("sampler", {})["error"] = traceback.format_exc()[-2000:]
    finally:
        if sampler is not None:
            try:
                sampler.close()
            except Exception as exc:
                err("sampler close", exc)
    if has_cuda:
        try:
            with CopyStream(torch, "h2d") as cs:
                doc["phases"]["h2d"] = raw_phase(nv, handles, gpms, 1.0)
            doc["copy"]["h2d"] = cs.summary()
        except Exception as exc:
            err("h2d phase", exc)
    for g in gpms:
        g.free()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outfile", type=Path, help="the JSON file to write")
    out = ap.parse_args(argv).outfile
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "tool": "commtop benchmarks/probes/capture_nvml.py",
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "sample_s": SAMPLE_S,
        "copy_bytes": COPY_BYTES,
        "gpm_ids": list(GPM_IDS),
    }
    try:
        capture(doc)
    except BaseException as exc:  # incl. KeyboardInterrupt: still write what we have
        err("capture", exc)
        doc["fatal"] = traceback.format_exc()[-4000:]
    try:
        doc["summary"] = summarise(doc)
    except Exception as exc:
        err("summary", exc)
    doc["errors"] = errors
    doc["finished_utc"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=None, separators=(",", ":"), allow_nan=False, default=plain))
    print(json.dumps(doc.get("summary", {}), indent=1, default=str))
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(errors)} errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
