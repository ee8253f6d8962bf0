"""Probe capture mechanisms on a GPU: Flight Recorder timing, CUPTI activity, CUDA events.

    python3 benchmarks/probes/capture_probe.py --out $OUT        # one H200, world size 1, ~3 min

Needs torch with NCCL and, for CUPTI, ``cupti-python`` (+ ``cuda-bindings``, ``cuda-pathfinder``).
Writes into --out: ``probe.json`` (every number below), ``fr_dump.pkl`` (a real Flight Recorder
dump of a mixed set of collectives and two DDP steps, timing on), ``cupti_records.json`` (the CUPTI
fields commtop decodes, for the same section, plus host/CUPTI clock pairs). Sections:

a. Flight Recorder dump cost against ring size (child processes, one ring size each) and whether
   the dump holds the GIL (longest stall of a spinning thread during one dump).
b. CUPTI MEMCPY + CONCURRENT_KERNEL records from a buffer-completed callback.
c. Overhead of a collectives-only loop, blocks alternating bare / CUDA events / FR timing /
   CUPTI (ABBA order per pair): wall time per op (ratio to bare in the same pair, 95 % CI) and
   loop-thread CPU per op (``time.thread_time_ns``). Bare and CUDA-event blocks run on an
   untimed process group, FR blocks on a second group with ``_enable_collectives_timing``, so
   all four alternate in one process.
d. Agreement: p50 durations from FR (collectives) and CUPTI (copies, and the world-size-1
   all_gather, which is a DtoD memcpy) against CUDA events around the same work, in each offload
   mode (none / overlap / sync / sync-barrier), plus start-time offsets against the events.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

LOG: list[str] = []
RESULT: dict[str, Any] = {}


def say(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def t_ci(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % half-width (Student t) of a few values."""
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return m, float("nan")
    tq = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(n, 2.1)
    return m, tq * statistics.stdev(values) / math.sqrt(n)


def init_dist() -> Any:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("LOCAL_RANK", "0")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    return dist


def dump_fn() -> Any:
    import torch

    c10d = torch._C._distributed_c10d
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, name, None)
        if fn is not None:
            return fn
    raise RuntimeError("no Flight Recorder dump function")


def dump(only_active: bool = False) -> bytes:
    return dump_fn()(includeCollectives=True, includeStackTraces=False, onlyActive=only_active)


def enable_timing(pg: Any) -> str:
    import torch

    for target in (pg, pg._get_backend(torch.device("cuda"))):
        fn = getattr(target, "_enable_collectives_timing", None)
        if fn is not None:
            fn()
            return type(target).__name__
    raise RuntimeError("no _enable_collectives_timing")


# --------------------------------------------------------------------------- a: ring child


def ring_child(size: int) -> None:
    """Fill a ring of ``size`` (0 = torch's default) with tiny all_reduces and time dumps."""
    import torch

    dist = init_dist()
    x = torch.ones(1, device="cuda")
    for _ in range((size or 2000) + 200):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    time.sleep(1.0)  # the watchdog retires the works
    dumps, loads, sizes, n = [], [], [], 0
    for _ in range(10):
        t0 = time.perf_counter_ns()
        raw = dump()
        t1 = time.perf_counter_ns()
        d = pickle.loads(raw)
        t2 = time.perf_counter_ns()
        dumps.append((t1 - t0) / 1e6)
        loads.append((t2 - t1) / 1e6)
        sizes.append(len(raw))
        n = len(d.get("entries", []))
    t0 = time.perf_counter_ns()
    raw_active = dump(only_active=True)
    active_ms = (time.perf_counter_ns() - t0) / 1e6
    # Does the dump hold the GIL? A spinning thread measures its longest stall during dumps.
    stop = threading.Event()
    gaps: list[float] = []

    def spin() -> None:
        last = time.perf_counter_ns()
        worst = 0
        while not stop.is_set():
            now = time.perf_counter_ns()
            worst = max(worst, now - last)
            last = now
        gaps.append(worst / 1e6)

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.05)
    t0 = time.perf_counter_ns()
    for _ in range(5):
        dump()
    dump_total = (time.perf_counter_ns() - t0) / 1e6 / 5
    stop.set()
    th.join()
    out = {
        "ring_env": size,
        "entries": n,
        "dump_ms_p50": statistics.median(dumps),
        "unpickle_ms_p50": statistics.median(loads),
        "bytes": sizes[-1],
        "only_active_ms": active_ms,
        "only_active_entries": len(pickle.loads(raw_active).get("entries", [])),
        "dump_ms_with_spinner": dump_total,
        "spinner_longest_stall_ms": gaps[0] if gaps else float("nan"),
    }
    print("RING " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def section_a(out_dir: str) -> None:
    rows = []
    for size in (0, 256, 2048, 16384):
        env = dict(os.environ)
        for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
            env.pop(k, None)
            if size:
                env[k] = str(size)
        p = subprocess.run(
            [sys.executable, __file__, "--ring-child", str(size)], env=env, capture_output=True, text=True, timeout=120
        )
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RING ")]
        if not line:
            say(f"a: ring {size}: child failed rc={p.returncode}: {p.stderr[-800:]}")
            continue
        row = json.loads(line[0][5:])
        rows.append(row)
        say(
            f"a: ring env={size or 'default'} entries={row['entries']} dump {row['dump_ms_p50']:.2f} ms "
            f"unpickle {row['unpickle_ms_p50']:.2f} ms bytes {row['bytes']} onlyActive {row['only_active_ms']:.2f} ms "
            f"({row['only_active_entries']} entries); spinner stall {row['spinner_longest_stall_ms']:.2f} ms "
            f"vs dump {row['dump_ms_with_spinner']:.2f} ms"
        )
    RESULT["a_ring"] = rows


# --------------------------------------------------------------------------- b: CUPTI


class Cupti:
    """CUPTI activity records, converted to plain tuples in the buffer-completed callback."""

    def __init__(self) -> None:
        from cupti import cupti

        self.c = cupti
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.callbacks = 0
        self.callback_cpu_ns = 0
        self.kinds = [cupti.ActivityKind.MEMCPY, cupti.ActivityKind.CONCURRENT_KERNEL]
        self.memcpy = int(cupti.ActivityKind.MEMCPY)
        self.kernel = int(cupti.ActivityKind.CONCURRENT_KERNEL)
        cupti.activity_register_callbacks(self._requested, self._completed)
        self.keep = True

    def _requested(self) -> tuple[int, int]:
        return 4 << 20, 0

    def _completed(self, activities: list[Any]) -> None:
        t0 = time.thread_time_ns()
        out = []
        for a in activities:
            k = a.kind
            if k == self.memcpy:
                out.append(
                    {
                        "kind": "MEMCPY",
                        "copy_kind": int(a.copy_kind),
                        "src_kind": int(a.src_kind),
                        "dst_kind": int(a.dst_kind),
                        "bytes": int(a.bytes),
                        "start": int(a.start),
                        "end": int(a.end),
                        "device_id": int(a.device_id),
                        "context_id": int(a.context_id),
                        "stream_id": int(a.stream_id),
                        "correlation_id": int(a.correlation_id),
                        "flags": int(a.flags_),
                    }
                )
            elif k == self.kernel:
                out.append(
                    {
                        "kind": "CONCURRENT_KERNEL",
                        "name": str(a.name),
                        "start": int(a.start),
                        "end": int(a.end),
                        "device_id": int(a.device_id),
                        "context_id": int(a.context_id),
                        "stream_id": int(a.stream_id),
                        "correlation_id": int(a.correlation_id),
                        "grid": [int(a.grid_x), int(a.grid_y), int(a.grid_z)],
                        "block": [int(a.block_x), int(a.block_y), int(a.block_z)],
                    }
                )
        with self.lock:
            if self.keep:
                self.records.extend(out)
            self.callbacks += 1
            self.callback_cpu_ns += time.thread_time_ns() - t0

    def enable(self) -> None:
        for k in self.kinds:
            self.c.activity_enable(k)
        self.c.activity_flush_period(200)

    def disable(self) -> None:
        self.c.activity_flush_all(1)
        for k in self.kinds:
            self.c.activity_disable(k)
        self.c.activity_flush_all(1)

    def take(self) -> list[dict[str, Any]]:
        self.c.activity_flush_all(1)
        with self.lock:
            out, self.records = self.records, []
        return out

    def clock_pair(self) -> dict[str, int]:
        a = time.time_ns()
        c = int(self.c.get_timestamp())
        b = time.time_ns()
        return {"cupti_ns": c, "time_ns": (a + b) // 2, "monotonic_ns": time.monotonic_ns()}


# --------------------------------------------------------------------------- fixtures


def fixtures(out_dir: str, dist: Any, cup: Cupti | None) -> Any:
    import torch
    from torch import nn

    world = dist.group.WORLD
    RESULT["timing_enabled_on"] = enable_timing(world)
    sub = dist.new_group(backend="nccl")
    enable_timing(sub)
    dev = torch.device("cuda", 0)
    pairs = []
    if cup is not None:
        pairs.append(cup.clock_pair())
        cup.enable()
    side = torch.cuda.Stream()
    a = torch.ones(1 << 20, device=dev)
    b = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    g_in = torch.ones(8192 * 1024, device=dev, dtype=torch.bfloat16)
    g_out = torch.empty_like(g_in)
    dist.all_reduce(a)
    dist.all_reduce(b)
    dist.all_gather_into_tensor(g_out, g_in)
    rs_out = torch.empty(1 << 20, device=dev)
    dist.reduce_scatter_tensor(rs_out, a)
    dist.broadcast(a, 0)
    dist.all_to_all_single(torch.empty_like(a), a)
    w = dist.all_reduce(a, async_op=True)
    w.wait()
    dist.all_reduce(a, group=sub)
    dist.barrier()
    host = torch.empty(32 << 20, dtype=torch.uint8, pin_memory=True)
    src = torch.ones(32 << 20, dtype=torch.uint8, device=dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        host.copy_(src, non_blocking=True)  # D2H pinned
        src.copy_(host, non_blocking=True)  # H2D pinned
    pageable = torch.empty(4 << 20, dtype=torch.uint8)
    pageable.copy_(src[: 4 << 20])  # D2H pageable (blocking)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024)).to(dev), device_ids=[0]
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device=dev)
    for _ in range(2):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    time.sleep(1.0)
    raw = dump()
    with open(os.path.join(out_dir, "fr_dump.pkl"), "wb") as f:
        f.write(raw)
    d = pickle.loads(raw)
    ents = d.get("entries", [])
    RESULT["fr_fixture"] = {
        "bytes": len(raw),
        "entries": len(ents),
        "top_keys": sorted(d),
        "entry_keys": sorted(ents[0]) if ents else [],
    }
    say(f"fixture: FR dump {len(raw)} bytes, {len(ents)} entries, keys {sorted(d)}")
    for e in ents[:40]:
        say(
            "  FR "
            + " ".join(
                f"{k}={e.get(k)!r}"
                for k in (
                    "record_id",
                    "pg_id",
                    "collective_seq_id",
                    "p2p_seq_id",
                    "op_id",
                    "profiling_name",
                    "input_sizes",
                    "input_dtypes",
                    "output_sizes",
                    "state",
                    "duration_ms",
                    "time_created_ns",
                    "time_discovered_started_ns",
                    "time_discovered_completed_ns",
                    "is_p2p",
                    "process_group",
                )
            )
        )
    if cup is not None:
        recs = cup.take()
        pairs.append(cup.clock_pair())
        kinds = {}
        for r in recs:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
        with open(os.path.join(out_dir, "cupti_records.json"), "w") as f:
            json.dump(
                {
                    "captured": "H200, torch " + torch.__version__ + ", cupti-python 13.0.1, world size 1",
                    "copy_kind_names": {int(k): k.name for k in cup.c.ActivityMemcpyKind},
                    "memory_kind_names": {int(k): k.name for k in cup.c.ActivityMemoryKind},
                    "clock_pairs": pairs,
                    "records": recs,
                },
                f,
                indent=1,
            )
        say(f"fixture: CUPTI {len(recs)} records {kinds}")
        for r in recs[:30]:
            say(f"  CUPTI {r}")
        cup.disable()
    return sub


# --------------------------------------------------------------------------- c: overhead


class EventRing:
    """Today's path: a ring of CUDA event pairs on the issuing stream, harvested by query()."""

    def __init__(self, torch: Any, n: int = 4096) -> None:
        self.start = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        self.end = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        self.n = n
        self.head = 0
        self.tail = 0
        self.rows: list[float] = []

    def begin(self) -> int:
        i = self.head % self.n
        self.start[i].record()
        return i

    def finish(self, i: int) -> None:
        self.end[i].record()
        self.head += 1
        if self.head - self.tail >= 64:
            self.harvest()

    def harvest(self) -> None:
        while self.tail < self.head:
            i = self.tail % self.n
            if not self.end[i].query():
                break
            self.rows.append(self.start[i].elapsed_time(self.end[i]))
            self.tail += 1


class FrDrain:
    """A background thread that dumps the Flight Recorder and decodes new entries."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.active = threading.Event()
        self.stop = threading.Event()
        self.seen = -1
        self.new = 0
        self.dump_ms: list[float] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            self.active.wait(0.1)
            if not self.active.is_set():
                continue
            t0 = time.perf_counter_ns()
            d = pickle.loads(dump())
            done = [
                e
                for e in d.get("entries", [])
                if e.get("record_id", -1) > self.seen and e.get("duration_ms") is not None
            ]
            if done:
                self.seen = max(e["record_id"] for e in done)
                self.new += len(done)
            self.dump_ms.append((time.perf_counter_ns() - t0) / 1e6)
            self.stop.wait(self.period_s)


def section_c(dist: Any, timed: Any, untimed: Any, cup: Cupti | None, pairs: int, no_drain: bool = False) -> None:
    import torch

    dev = torch.device("cuda", 0)
    drain = FrDrain()
    if no_drain:
        drain.stop.set()  # "fr" = NCCL collective timing alone
    workloads = {
        "all_gather_8192x8192_bf16": (torch.ones(8192 * 8192, device=dev, dtype=torch.bfloat16), 3000),
        "all_reduce_1xf32": (torch.ones(1, device=dev), 20000),
    }
    variants = ["bare", "events", "fr", "cupti"] + (["fr+cupti"] if cup is not None else [])
    if cup is None:
        variants.remove("cupti")
    res: dict[str, Any] = {}
    for wname, (x, n_ops) in workloads.items():
        out = torch.empty_like(x) if wname.startswith("all_gather") else None

        def op(group: Any, x: Any = x, out: Any = out) -> None:
            if out is not None:
                dist.all_gather_into_tensor(out, x, group=group)
            else:
                dist.all_reduce(x, group=group)

        def block(v: str, n: int) -> tuple[float, float]:
            group = timed if v.startswith("fr") else untimed
            ring = EventRing(torch) if v == "events" else None
            if v.startswith("fr"):
                drain.active.set()
            if "cupti" in v and cup is not None:
                cup.enable()
            for _ in range(20):
                op(group)
            torch.cuda.synchronize()
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            if ring is None:
                for _ in range(n):
                    op(group)
            else:
                for _ in range(n):
                    i = ring.begin()
                    op(group)
                    ring.finish(i)
            torch.cuda.synchronize()
            w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            if ring is not None:
                ring.harvest()
            if "cupti" in v and cup is not None:
                cup.disable()
                with cup.lock:
                    cup.records = []
            drain.active.clear()
            return (w1 - w0) / n / 1e3, (c1 - c0) / n / 1e3

        block("bare", n_ops // 4)  # warm
        walls: dict[str, list[float]] = {v: [] for v in variants}
        cpus: dict[str, list[float]] = {v: [] for v in variants}
        for p in range(pairs):
            order = variants if p % 2 == 0 else list(reversed(variants))
            for v in order:
                w, c = block(v, n_ops)
                walls[v].append(w)
                cpus[v].append(c)
        row: dict[str, Any] = {}
        for v in variants:
            ratios = [walls[v][i] / walls["bare"][i] for i in range(pairs)]
            dcpu = [cpus[v][i] - cpus["bare"][i] for i in range(pairs)]
            rm, rci = t_ci(ratios)
            cm, cci = t_ci(dcpu)
            row[v] = {
                "wall_us_per_op": statistics.median(walls[v]),
                "cpu_us_per_op": statistics.median(cpus[v]),
                "ratio_mean": rm,
                "ratio_ci95": rci,
                "extra_cpu_us_mean": cm,
                "extra_cpu_us_ci95": cci,
            }
            say(
                f"c: {wname:28s} {v:9s} wall {row[v]['wall_us_per_op']:8.2f} us/op  ratio {rm:.4f} +- {rci:.4f}  "
                f"loop CPU {row[v]['cpu_us_per_op']:7.2f} us/op (extra {cm:+.2f} +- {cci:.2f})"
            )
        res[wname] = row
    res["fr_drain"] = {
        "dumps": len(drain.dump_ms),
        "dump_ms_p50": statistics.median(drain.dump_ms) if drain.dump_ms else None,
        "new_entries": drain.new,
    }
    say(f"c: FR drain {res['fr_drain']}")
    if cup is not None:
        res["cupti_callback"] = {"callbacks": cup.callbacks, "cpu_ms": cup.callback_cpu_ns / 1e6}
        say(f"c: CUPTI callbacks {res['cupti_callback']}")
    drain.stop.set()
    RESULT["c_overhead"] = res


# --------------------------------------------------------------------------- d: agreement


def section_d(dist: Any, timed: Any, untimed: Any, cup: Cupti | None, steps: int) -> None:
    import torch

    dev = torch.device("cuda", 0)
    x = torch.ones(8192 * 8192, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    src = torch.ones(8192 * 8192, device=dev, dtype=torch.bfloat16)
    hosts = [torch.empty(src.shape, dtype=src.dtype, pin_memory=True) for _ in range(5)]
    side = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    torch.cuda.synchronize()
    anchor = torch.cuda.Event(enable_timing=True)
    anchor.record()
    torch.cuda.synchronize()
    anchor_ns = time.time_ns()
    res: dict[str, Any] = {}
    for mode in ("none", "overlap", "sync", "sync-barrier"):
        if cup is not None:
            cup.enable()
            pair0 = cup.clock_pair()
        seen_rec = max((e.get("record_id", -1) for e in pickle.loads(dump()).get("entries", [])), default=-1)
        coll_ev, copy_ev = [], []
        for _ in range(steps):
            if mode != "none":
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    for h in hosts:
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record(side)
                        h.copy_(src, non_blocking=True)
                        e.record(side)
                        copy_ev.append((s, e))
                if mode.startswith("sync"):
                    side.synchronize()
                if mode == "sync-barrier":
                    dist.barrier(group=untimed)
            for _ in range(32):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                dist.all_gather_into_tensor(out, x, group=timed)
                e.record()
                coll_ev.append((s, e))
        torch.cuda.synchronize()
        time.sleep(0.6)
        ents = [
            e
            for e in pickle.loads(dump()).get("entries", [])
            if e.get("record_id", -1) > seen_rec and "all_gather" in str(e.get("profiling_name"))
        ]
        ev_coll = [s.elapsed_time(e) for s, e in coll_ev]
        ev_copy = [s.elapsed_time(e) for s, e in copy_ev]
        ev_coll_start = [anchor_ns + int(anchor.elapsed_time(s) * 1e6) for s, _ in coll_ev]
        fr = [e["duration_ms"] for e in ents if e.get("duration_ms") is not None]
        fr_created = [e["time_created_ns"] for e in ents]
        row: dict[str, Any] = {
            "n_events_coll": len(ev_coll),
            "n_fr": len(fr),
            "events_coll_p50_ms": statistics.median(ev_coll),
            "fr_coll_p50_ms": statistics.median(fr) if fr else None,
        }
        if len(fr_created) == len(ev_coll_start):
            off = [(c - s) / 1e3 for c, s in zip(fr_created, ev_coll_start, strict=True)]
            row["fr_created_minus_event_start_us_p50"] = statistics.median(off)
            row["fr_created_minus_event_start_us_p10_p90"] = [
                sorted(off)[len(off) // 10],
                sorted(off)[len(off) * 9 // 10],
            ]
        if ev_copy:
            row["events_copy_p50_ms"] = statistics.median(ev_copy)
            row["events_copy_gbps_p50"] = src.nbytes / (row["events_copy_p50_ms"] * 1e6)
        if cup is not None:
            recs = cup.take()
            pair1 = cup.clock_pair()
            cup.disable()
            d2h = [r for r in recs if r["kind"] == "MEMCPY" and r["copy_kind"] == int(cup.c.ActivityMemcpyKind.DTOH)]
            d2d = [r for r in recs if r["kind"] == "MEMCPY" and r["copy_kind"] == int(cup.c.ActivityMemcpyKind.DTOD)]
            ker = [r for r in recs if r["kind"] == "CONCURRENT_KERNEL"]
            row["cupti_counts"] = {"d2h": len(d2h), "d2d": len(d2d), "kernels": len(ker)}
            if d2h:
                row["cupti_copy_p50_ms"] = statistics.median((r["end"] - r["start"]) / 1e6 for r in d2h)
                row["cupti_copy_gbps_p50"] = statistics.median(r["bytes"] / (r["end"] - r["start"]) for r in d2h)
            if d2d:
                row["cupti_coll_d2d_p50_ms"] = statistics.median((r["end"] - r["start"]) / 1e6 for r in d2d)
                off_ns = (pair0["time_ns"] - pair0["cupti_ns"] + pair1["time_ns"] - pair1["cupti_ns"]) // 2
                row["cupti_clock_drift_us"] = (
                    (pair1["time_ns"] - pair1["cupti_ns"]) - (pair0["time_ns"] - pair0["cupti_ns"])
                ) / 1e3
                if len(d2d) == len(ev_coll_start):
                    off = [(r["start"] + off_ns - s) / 1e3 for r, s in zip(d2d, ev_coll_start, strict=True)]
                    row["cupti_start_minus_event_start_us_p50"] = statistics.median(off)
        for k in ("fr_coll_p50_ms", "cupti_coll_d2d_p50_ms"):
            if row.get(k):
                row[k.replace("_p50_ms", "_vs_events")] = row[k] / row["events_coll_p50_ms"]
        if row.get("cupti_copy_p50_ms"):
            row["cupti_copy_vs_events"] = row["cupti_copy_p50_ms"] / row["events_copy_p50_ms"]
        res[mode] = row
        say(f"d: {mode:12s} {json.dumps(row)}")
    RESULT["d_agreement"] = res


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--ring-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", default="", help="comma list of sections to skip (a,c,d)")
    ap.add_argument("--no-drain", action="store_true", help="c: FR blocks with NCCL timing only, no dumps")
    ns = ap.parse_args()
    if ns.ring_child is not None:
        ring_child(ns.ring_child)
        return 0
    os.makedirs(ns.out, exist_ok=True)
    skip = set(ns.skip.split(","))
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "4096")
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "4096")
    try:
        if "a" not in skip:
            section_a(ns.out)
    except Exception:
        say("a failed: " + traceback.format_exc())
    cup = None
    try:
        cup = Cupti()
    except Exception:
        say("CUPTI unavailable: " + traceback.format_exc())
    import torch

    RESULT["machine"] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "python": sys.version.split()[0],
    }
    say(f"machine {RESULT['machine']}")
    dist = init_dist()
    c10d = torch._C._distributed_c10d
    RESULT["c10d_fr_functions"] = sorted(n for n in dir(c10d) if "trace" in n.lower() or "fr" in n.lower())
    say(f"c10d FR functions: {RESULT['c10d_fr_functions']}")
    timed = untimed = None
    try:
        timed = fixtures(ns.out, dist, cup)
    except Exception:
        say("fixtures failed: " + traceback.format_exc())
    if timed is None:
        timed = dist.new_group(backend="nccl")
        enable_timing(timed)
    untimed = dist.new_group(backend="nccl")
    try:
        if "c" not in skip:
            section_c(dist, timed, untimed, cup, ns.pairs, ns.no_drain)
    except Exception:
        say("c failed: " + traceback.format_exc())
    try:
        if "d" not in skip:
            section_d(dist, timed, untimed, cup, ns.steps)
    except Exception:
        say("d failed: " + traceback.format_exc())
    with open(os.path.join(ns.out, "probe.json"), "w") as f:
        json.dump(RESULT, f, indent=1, default=str)
    with open(os.path.join(ns.out, "probe.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
