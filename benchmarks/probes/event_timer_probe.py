"""Where a CUDA-event record's cost goes on the GPU machine: host CPU per call (torch, ctypes,
cuda-bindings), GPU time the event pair adds to a collective loop, and how Flight Recorder, CUPTI
and CUDA events on one stream agree on the same world-size-1 all_gather.

    python3 benchmarks/probes/event_timer_probe.py --out-dir $OUT      # CUDA + NCCL, world size 1, ~2 min

Prints lines starting with ``P `` and writes ``event_timer_probe.json`` to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import pickle
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# the checkout's workers/ and tui/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

RESULT: dict[str, Any] = {}


def say(msg: str) -> None:
    print("P " + msg, flush=True)


def mean_ci(values: list[float]) -> tuple[float, float]:
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return m, float("nan")
    tq = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(n, 2.1)
    return m, tq * statistics.stdev(values) / math.sqrt(n)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cudart_path() -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcudart.so" in line:
                return line.split()[-1]
    return "libcudart.so"


def per_call_us(fn: Callable[[], object], n: int) -> float:
    c = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - c) / n * 1e6


# --------------------------------------------------------------------------- host costs


def host_costs(torch: Any, n: int) -> None:
    path = cudart_path()
    RESULT["cudart"] = path
    cdll, pydll = ctypes.CDLL(path), ctypes.PyDLL(path)
    for lib in (cdll, pydll):
        lib.cudaEventRecord.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        lib.cudaEventQuery.argtypes = (ctypes.c_void_p,)
        lib.cudaEventElapsedTime.argtypes = (ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p)
    stream = torch.cuda.current_stream()
    sp = stream.cuda_stream
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(stream)
    b.record(stream)
    torch.cuda.synchronize()
    ap, bp = a.cuda_event, b.cuda_event
    out = ctypes.c_float()
    ref = ctypes.byref(out)
    rows: dict[str, float] = {}
    rows["time.time_ns()"] = per_call_us(time.time_ns, n)
    rows["torch Event.record(stream)"] = per_call_us(lambda: a.record(stream), n)
    torch.cuda.synchronize()
    rec_c, rec_p = cdll.cudaEventRecord, pydll.cudaEventRecord
    rows["ctypes CDLL cudaEventRecord"] = per_call_us(lambda: rec_c(ap, sp), n)
    torch.cuda.synchronize()
    rows["ctypes PyDLL cudaEventRecord"] = per_call_us(lambda: rec_p(ap, sp), n)
    torch.cuda.synchronize()
    try:
        from cuda.bindings import runtime as cbr

        rows["cuda-bindings cudaEventRecord"] = per_call_us(lambda: cbr.cudaEventRecord(ap, sp), n)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        say(f"cuda-bindings not usable: {exc!r}")
    u = torch.cuda.Event()
    u.record(stream)
    torch.cuda.synchronize()
    up = u.cuda_event
    rows["ctypes PyDLL cudaEventRecord, untimed event"] = per_call_us(lambda: rec_p(up, sp), n)
    torch.cuda.synchronize()
    try:
        drv = ctypes.PyDLL("libcuda.so.1")
        drv.cuEventRecord.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        rec_d = drv.cuEventRecord
        rows["ctypes PyDLL cuEventRecord (driver API)"] = per_call_us(lambda: rec_d(ap, sp), n)
        torch.cuda.synchronize()
        rows["ctypes PyDLL cuEventRecord, untimed event"] = per_call_us(lambda: rec_d(up, sp), n)
        torch.cuda.synchronize()
    except OSError as exc:
        say(f"no libcuda: {exc!r}")
    b.record(stream)
    torch.cuda.synchronize()
    rows["torch Event.query() (done)"] = per_call_us(b.query, n)
    rows["torch Event.elapsed_time"] = per_call_us(lambda: a.elapsed_time(b), n)
    q_p, el_p = pydll.cudaEventQuery, pydll.cudaEventElapsedTime
    rows["ctypes PyDLL cudaEventQuery (done)"] = per_call_us(lambda: q_p(bp), n)
    rows["ctypes PyDLL cudaEventElapsedTime"] = per_call_us(lambda: el_p(ref, ap, bp), n)
    # a whole pair through the raw path: two records (timed) on the loop, one query + two elapsed off it
    ring = [torch.cuda.Event(enable_timing=True) for _ in range(8192)]
    for e in ring:
        e.record(stream)
    torch.cuda.synchronize()
    ptrs = [e.cuda_event for e in ring]
    anchor = ptrs[-1]
    m = 4095

    def loop_side(k: int) -> float:
        c = time.thread_time()
        for i in range(k):
            s = i & m
            rec_p(ptrs[2 * s], sp)
            rec_p(ptrs[2 * s + 1], sp)
        return (time.thread_time() - c) / k * 1e6

    rows["loop side: 2 x PyDLL record, ring slot (per record)"] = loop_side(n)
    torch.cuda.synchronize()
    el = pydll.cudaEventElapsedTime
    c = time.thread_time()
    starts = []
    durs = []
    for s in range(4096):
        q_p(ptrs[2 * s + 1])
        el(ref, anchor, ptrs[2 * s])
        starts.append(out.value)
        el(ref, ptrs[2 * s], ptrs[2 * s + 1])
        durs.append(out.value)
    rows["reader side: query + 2 elapsed (per record)"] = (time.thread_time() - c) / 4096 * 1e6
    for k, v in rows.items():
        say(f"host {k}: {v:.3f} us")
    RESULT["host_us"] = rows


# --------------------------------------------------------------------------- GPU-side cost


class Cupti:
    def __init__(self) -> None:
        from cupti import cupti

        self.c = cupti
        self.n = 0
        self.memcpy = int(cupti.ActivityKind.MEMCPY)
        self.kernel = int(cupti.ActivityKind.CONCURRENT_KERNEL)
        self.rows: list[tuple[int, int, int, int]] = []  # kind, copy_kind, start, end
        self.cb_cpu_ns = 0
        cupti.activity_register_callbacks(lambda: (4 << 20, 0), self._done)

    def _done(self, acts: list[Any]) -> None:
        t = time.thread_time_ns()
        rows = self.rows
        for a in acts:
            k = a.kind
            if k == self.memcpy:
                rows.append((0, int(a.copy_kind), int(a.start), int(a.end)))
            elif k == self.kernel:
                rows.append((1, 0, int(a.start), int(a.end)))
        self.n += len(acts)
        self.cb_cpu_ns += time.thread_time_ns() - t

    def enable(self) -> None:
        self.c.activity_enable(self.c.ActivityKind.MEMCPY)
        self.c.activity_enable(self.c.ActivityKind.CONCURRENT_KERNEL)
        self.c.activity_flush_period(200)

    def disable(self) -> None:
        self.c.activity_flush_all(1)
        self.c.activity_disable(self.c.ActivityKind.MEMCPY)
        self.c.activity_disable(self.c.ActivityKind.CONCURRENT_KERNEL)
        self.c.activity_flush_all(1)


def gpu_ab(torch: Any, dist: Any, rounds: int, cup: Cupti | None) -> None:
    path = cudart_path()
    pydll = ctypes.PyDLL(path)
    pydll.cudaEventRecord.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    rec = pydll.cudaEventRecord
    stream = torch.cuda.current_stream()
    sp = stream.cuda_stream
    cap = 4096
    timed = [torch.cuda.Event(enable_timing=True) for _ in range(2 * cap)]
    untimed = [torch.cuda.Event() for _ in range(2 * cap)]
    for e in timed + untimed:
        e.record(stream)
    torch.cuda.synchronize()
    tp = [e.cuda_event for e in timed]
    up = [e.cuda_event for e in untimed]
    mask = cap - 1

    numel = 8192 * 8192
    x = torch.ones(numel, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    one = torch.ones(1, device="cuda")
    src = torch.ones(numel, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    works = {
        "all_gather 8192x8192 bf16": (lambda: dist.all_gather_into_tensor(out, x), 3000),
        "all_reduce 1 x fp32": (lambda: dist.all_reduce(one), 6000),
        "DtoD copy 128 MiB (one stream)": (lambda: dst.copy_(src), 3000),
    }

    def v_bare(f: Callable[[], Any], n: int) -> None:
        for _ in range(n):
            f()

    def v_torch2(f: Callable[[], Any], n: int) -> None:
        for i in range(n):
            s = i & mask
            timed[2 * s].record(stream)
            f()
            timed[2 * s + 1].record(stream)

    def v_raw2(f: Callable[[], Any], n: int) -> None:
        for i in range(n):
            s = i & mask
            rec(tp[2 * s], sp)
            f()
            rec(tp[2 * s + 1], sp)

    def v_raw2_untimed(f: Callable[[], Any], n: int) -> None:
        for i in range(n):
            s = i & mask
            rec(up[2 * s], sp)
            f()
            rec(up[2 * s + 1], sp)

    def v_raw1(f: Callable[[], Any], n: int) -> None:
        for i in range(n):
            f()
            rec(tp[i & mask], sp)

    variants: dict[str, Callable[[Callable[[], Any], int], None]] = {
        "bare": v_bare,
        "torch pair": v_torch2,
        "raw pair": v_raw2,
        "raw pair untimed": v_raw2_untimed,
        "raw one per op": v_raw1,
    }
    if cup is not None:
        variants["cupti"] = v_bare
    res: dict[str, Any] = {}
    for wname, (f, n) in works.items():
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        per: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        names = list(variants)
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for v in order:
                if v == "cupti":
                    assert cup is not None
                    cup.enable()
                torch.cuda.synchronize()
                w0, c0 = time.perf_counter(), time.thread_time()
                variants[v](f, n)
                c1 = time.thread_time()
                torch.cuda.synchronize()
                w1 = time.perf_counter()
                if v == "cupti":
                    assert cup is not None
                    cup.disable()
                per[v].append(((w1 - w0) / n * 1e6, (c1 - c0) / n * 1e6))
        base = per["bare"]
        wres = {}
        for v in names:
            ratio = mean_ci([b[0] / a[0] for a, b in zip(base, per[v], strict=True)])
            cpu = mean_ci([b[1] - a[1] for a, b in zip(base, per[v], strict=True)])
            wall = statistics.median(p[0] for p in per[v])
            wres[v] = {"us_per_op": wall, "ratio": ratio, "loop_cpu_extra_us": cpu}
            say(
                f"gpu {wname} | {v}: {wall:.3f} us/op, ratio {ratio[0]:.4f} ± {ratio[1]:.4f}, "
                f"loop CPU {cpu[0]:+.2f} ± {cpu[1]:.2f} us/op"
            )
        res[wname] = wres
    RESULT["gpu_ab"] = res
    if cup is not None:
        RESULT["cupti_cb_cpu_us_per_record"] = cup.cb_cpu_ns / 1e3 / max(1, cup.n)
        say(f"cupti callback CPU {RESULT['cupti_cb_cpu_us_per_record']:.2f} us/record over {cup.n} records")


# --------------------------------------------------------------------------- agreement


def agreement(torch: Any, dist: Any, cup: Cupti | None, n: int) -> None:
    """One all_gather loop on a timed group: FR duration_ms, CUPTI's DtoD memcpy, and an event
    pair on the issuing stream, per collective; then the same 128 MiB DtoD copy on one stream
    with an event pair (events on the stream that does the work, no cross-stream waits)."""
    import numpy as np

    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace
    pg = dist.new_group(backend="nccl")
    for target in (pg, pg._get_backend(torch.device("cuda"))):
        fn = getattr(target, "_enable_collectives_timing", None)
        if fn is not None:
            fn()
            break
    numel = 8192 * 8192
    x = torch.ones(numel, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    src = torch.ones(numel, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    stream = torch.cuda.current_stream()
    for _ in range(20):
        dist.all_gather_into_tensor(out, x, group=pg)
    torch.cuda.synchronize()
    time.sleep(1.0)
    seen = max(
        [
            e.get("record_id", -1)
            for e in pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)).get(
                "entries", []
            )
        ]
        + [-1]
    )
    table: dict[str, Any] = {}
    for paced in (False, True):
        label = "host-paced" if paced else "queued"
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        cev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        if cup is not None:
            cup.rows.clear()
            cup.enable()
        torch.cuda.synchronize()
        for a, b in ev:
            a.record(stream)
            dist.all_gather_into_tensor(out, x, group=pg)
            b.record(stream)
            if paced:
                b.synchronize()
        torch.cuda.synchronize()
        for a, b in cev:
            a.record(stream)
            dst.copy_(src)
            b.record(stream)
            if paced:
                b.synchronize()
        torch.cuda.synchronize()
        if cup is not None:
            cup.disable()
        time.sleep(1.5)  # the watchdog retires the works and fills duration_ms
        ents = [
            e
            for e in pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)).get(
                "entries", []
            )
            if e.get("record_id", -1) > seen and "all_gather" in str(e.get("profiling_name"))
        ]
        seen = max([e.get("record_id", -1) for e in ents] + [seen])
        fr = [float(e["duration_ms"]) for e in ents if e.get("duration_ms") is not None]
        evd = [a.elapsed_time(b) for a, b in ev]
        cevd = [a.elapsed_time(b) for a, b in cev]
        dtod = [(e - s) / 1e6 for k, ck, s, e in (cup.rows if cup is not None else []) if k == 0 and ck == 8]
        coll_cupti, copy_cupti = dtod[: len(dtod) // 2], dtod[len(dtod) // 2 :]
        row = {
            "n": n,
            "fr_n": len(fr),
            "cupti_dtod_n": len(dtod),
            "issuing_events_p50_ms": float(np.median(evd)),
            "fr_p50_ms": float(np.median(fr)) if fr else float("nan"),
            "cupti_coll_memcpy_p50_ms": float(np.median(coll_cupti)) if coll_cupti else float("nan"),
            "same_stream_copy_events_p50_ms": float(np.median(cevd)),
            "cupti_copy_p50_ms": float(np.median(copy_cupti)) if copy_cupti else float("nan"),
        }
        table[label] = row
        say(f"agree {label}: " + json.dumps(row))
    RESULT["agreement"] = table


def timer_paths(torch: Any, dist: Any, n: int) -> None:
    """workers.rank.timing.CudaTimer through the CUDA runtime directly vs through torch's Event
    methods, on alternate collectives of one all_gather loop: the same durations (p50)."""
    import numpy as np

    from workers.rank.cuda_events import TorchEvents, runtime_events
    from workers.rank.timing import Anchor, CudaTimer

    stream = torch.cuda.current_stream()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(stream)
    ev.synchronize()
    anchor = Anchor(ev, time.time_ns())
    api = runtime_events(torch)
    say(f"timer api: {api.name} {getattr(api, 'path', '')}")
    timers = {
        "cudart": CudaTimer(torch, n, anchor, stream, api),
        "torch": CudaTimer(torch, n, anchor, stream, TorchEvents()),
    }
    numel = 8192 * 8192
    x = torch.ones(numel, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    res = {}
    for paced in (False, True):
        for i in range(2 * n):
            t = timers["cudart" if i % 2 == 0 else "torch"]
            slot = t.begin((i,))
            dist.all_gather_into_tensor(out, x)
            t.end(slot)
            if paced:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        row = {}
        for name, t in timers.items():
            rows: list[Any] = []
            t.harvest(rows)
            row[name] = float(np.median([r[-1] for r in rows])) / 1000.0
        row["ratio"] = row["cudart"] / row["torch"]
        res["host-paced" if paced else "queued"] = row
        say(f"timer paths {'host-paced' if paced else 'queued'}: {json.dumps(row)}")
    RESULT["timer_paths"] = res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--no-cupti", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated sections: host,gpu,agreement,paths")
    ap.add_argument("--tag", default="", help="suffix of the json file")
    ap.add_argument("--agree-n", type=int, default=400)
    ns = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "4096")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    RESULT["versions"] = {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpu": torch.cuda.get_device_name(0),
        "python": sys.version.split()[0],
    }
    say(json.dumps(RESULT["versions"]))
    cup = None
    if not ns.no_cupti:
        try:
            cup = Cupti()
        except Exception as exc:  # noqa: BLE001
            say(f"no CUPTI: {exc!r}")
    for name, fn in (
        ("host", lambda: host_costs(torch, ns.n)),
        ("gpu", lambda: gpu_ab(torch, dist, ns.rounds, cup)),
        ("agreement", lambda: agreement(torch, dist, cup, ns.agree_n)),
        ("paths", lambda: timer_paths(torch, dist, 1000)),
    ):
        if ns.only and name not in ns.only.split(","):
            continue
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            say(f"{name} failed: {exc!r}")
        say(f"{name} took {time.perf_counter() - t0:.1f} s")
        with open(os.path.join(ns.out_dir, f"event_timer_probe{ns.tag}.json"), "w") as f:
            json.dump(RESULT, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
