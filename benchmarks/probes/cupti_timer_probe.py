"""CUPTI activity timing of the synthetic loop on the GPU machine: does the raw CUPTI
client decode records right, what does a record cost, and do its durations agree with CUDA events
around the same collectives and copies in every offload mode.

    python3 benchmarks/probes/cupti_timer_probe.py capture --out-dir $OUT     # CUDA + NCCL, world size 1
    python3 benchmarks/probes/cupti_timer_probe.py layouts --out-dir $OUT     # needs cupti-python; after capture

``capture`` runs the loop with both timers on the same operations (CUDA events on the issuing and
side streams, and CUPTI records), saves a few raw CUPTI buffers with the offsets CUPTI's own
``cuptiActivityGetNextRecord`` walk gives (``cupti_buffers.bin`` / ``.json``: the test fixture),
and prints lines starting with ``P ``. ``layouts`` (another process: one CUPTI library per
process) decodes the saved records with cupti-python's numpy dtypes, the reference the fixture
test compares :func:`workers.rank.cupti_activity.decode_buffer` against.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

# the checkout's workers/ and tui/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

RESULT: dict[str, Any] = {}
FIXTURE_BUFFERS = 3
FIXTURE_BYTES = 48 * 1024
#: Further all_gather sizes for the agreement (the first is 8192 x 8192 bf16, 128 MiB, ~65 us).
SHAPES = [(2048, 8192), (16384, 16384)]


def say(msg: str) -> None:
    print("P " + msg, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cupti_walk(lib: Any, data: bytes) -> list[int]:
    """Record offsets as CUPTI's own iterator gives them (the reference for our walk)."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    base = ctypes.addressof(buf)
    rec = ctypes.c_void_p(None)
    offsets = []
    while lib.cuptiActivityGetNextRecord(ctypes.c_void_p(base), len(data), ctypes.byref(rec)) == 0 and rec.value:
        offsets.append(int(rec.value) - base)
    return offsets


class Tee:
    """Both timers on the same operations: CUPTI rows to ``a``, CUDA-event rows to ``b``."""

    def __init__(self, cupti_timer: Any, event_timer: Any) -> None:
        self.c, self.e = cupti_timer, event_timer
        self.a: list[Any] = []
        self.b: list[Any] = []
        self.untimed = 0

    def begin(self, meta: Any) -> Any:
        self.c.begin(meta)
        return self.e.begin(meta)

    def end(self, token: Any) -> None:
        self.e.end(token)

    def settle(self) -> None:
        self.c.settle()

    def harvest(self, out: list[Any]) -> None:
        self.c.harvest(self.a)
        self.e.harvest(self.b)


def capture(out_dir: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from workers.rank import cupti_activity
    from workers.rank.control import StaticControl
    from workers.rank.cuda_events import runtime_events
    from workers.rank.cupti_timer import CuptiFeed, CuptiTimer, learn_collective
    from workers.rank.heartbeat import StopFlag, WorkerStatus
    from workers.rank.publisher import NullPublisher, RecordBatcher
    from workers.rank.timing import Anchor, CudaTimer, Instrumentation
    from workers.synthetic import loop
    from workers.wire.config import LoopConfig
    from workers.wire.settings import Settings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    cp = cupti_activity.client()
    say(f"libcupti {cp.path}")
    cp.raw_sink = []
    config = LoopConfig(collective="all_gather", shape=(8192, 8192), dtype="bfloat16", collectives_per_step=16)
    rt = loop.Runtime(0, 1, 0, 1, True, "nccl", 0)
    work = loop.Workload(config, rt)
    loop.warm_up(work, 5, config.initial_settings())
    t0 = time.perf_counter()
    sig = learn_collective(cp, work.collective, torch.cuda.synchronize)
    say(f"learnt in {1e3 * (time.perf_counter() - t0):.1f} ms: {sig}")
    RESULT["signature"] = repr(sig)
    assert sig is not None
    work.cupti_signature = sig

    x = torch.ones(1 << 20, device="cuda")
    for _ in range(3):  # a few non-NCCL kernels for the fixture
        x.add_(1)
        torch.cuda._sleep(1000)

    torch.cuda.synchronize()
    main = torch.cuda.current_stream()
    ev0 = torch.cuda.Event(enable_timing=True)
    ev0.record()
    anchor = Anchor(ev0, time.time_ns(), spare=torch.cuda.Event(enable_timing=True), stream=main)
    ev0.synchronize()
    api = runtime_events(torch)
    cases = [(config.shape, m, True) for m in ("none", "overlap", "sync", "sync-barrier")] + [
        (config.shape, "overlap", False)
    ]
    cases += [(shape, m, True) for shape in SHAPES for m in ("none", "overlap")]
    for shape, mode, pinned in cases:
        if True:
            if shape != work.config.shape:
                work.close()
                del work
                torch.cuda.empty_cache()
                work = loop.Workload(dataclasses.replace(config, shape=shape), rt)
                loop.warm_up(work, 3, config.initial_settings())
                sig = learn_collective(cp, work.collective, torch.cuda.synchronize)
                say(f"{shape}: {sig}")
                assert sig is not None
            settings = Settings(mode=mode, copies=2, pinned=pinned, direction="d2h", copy_scale=0.5)
            cp.resume()
            torch.cuda.synchronize()
            feed = CuptiFeed(cp, sig, cp.timestamp())
            coll = Tee(CuptiTimer(feed, "collectives", 4096, sig.per_op), CudaTimer(torch, 4096, anchor, main, api))
            copy = Tee(CuptiTimer(feed, "copies", 1024), CudaTimer(torch, 1024, anchor, work.side, api))
            status = WorkerStatus(settings=settings)
            control = StaticControl(settings)
            batcher = RecordBatcher(
                NullPublisher(),
                control.status,
                op_index=work.op_index,
                coll_nbytes=work.nbytes,
                bus_factor=work.bus_factor,
                batch_ms=50,
            )
            step = CudaTimer(torch, 256, None, main, api)
            instr = Instrumentation(coll, copy, step, batcher, status, anchor, threaded=True)
            n = 30 * config.collectives_per_step
            loop.run_steps(work, instr, control, StopFlag(), status, n)
            instr.finish(work.synchronize)
            ca = [r[-1] for r in coll.a]
            ce = [r[-1] for r in coll.b]
            ka = [r[-1] for r in copy.a]
            ke = [r[-1] for r in copy.b]
            sa = [r[-2] for r in coll.a]
            se = [r[-2] for r in coll.b]
            k = min(len(sa), len(se))
            start_diff = [(sa[i] - se[i]) / 1e3 for i in range(k)]
            row = {
                "shape": list(shape),
                "mode": mode,
                "pinned": pinned,
                "coll_n": [len(ca), len(ce)],
                "coll_p50_us": [p50(ca), p50(ce)],
                "coll_ratio": p50(ca) / p50(ce) if ce else None,
                "copy_n": [len(ka), len(ke)],
                "copy_p50_us": [p50(ka), p50(ke)],
                "copy_ratio": p50(ka) / p50(ke) if ke else None,
                "start_minus_event_start_us_p50": p50(start_diff),
                "untimed_unmatched": [coll.c.untimed, coll.c.unmatched, copy.c.untimed, copy.c.unmatched],
            }
            RESULT.setdefault("agreement", []).append(row)
            say(json.dumps(row))
            work.close()

    # Raw buffers for the fixture, with CUPTI's own offsets: the first buffers, cut short.
    walked = []
    sinks, cp.raw_sink = cp.raw_sink or [], None
    for data in sinks[:FIXTURE_BUFFERS]:
        offs = cupti_walk(cp.lib, data)
        cut = [o for o in offs if o < FIXTURE_BYTES]
        end = offs[len(cut)] if len(cut) < len(offs) else len(data)
        walked.append((data[:end], cut))
        kinds = [int.from_bytes(data[o : o + 4], "little") for o in offs]
        say(
            f"buffer of {len(data)} bytes: {len(offs)} records, kinds {sorted(set(kinds))}; ours agree: "
            f"{cupti_activity.walk(lambda o, d=data: int.from_bytes(d[o : o + 4], 'little'), len(data), lambda k, o: cp.sizes.get(k, 0))[0] == offs}"
        )
    RESULT["record_sizes"] = {str(k): v for k, v in cp.sizes.items()}
    RESULT["buffers_seen"] = len(sinks)
    say(f"record sizes by kind: {cp.sizes}; buffers {len(sinks)}")

    # Costs: the loop thread's begin, the harvester's match, the callback's decode, a flush.
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(1000):
        cp.flush()
    RESULT["flush_us"] = [(time.thread_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3]
    say(f"cuptiActivityFlushAll(0): {RESULT['flush_us'][0]:.1f} us CPU, {RESULT['flush_us'][1]:.1f} us wall per call")
    feed = CuptiFeed(cp, sig, cp.timestamp())
    t = CuptiTimer(feed, "collectives", 4096)
    n = 200_000
    c0 = time.thread_time()
    for i in range(n):
        t.begin((i, 0, 0, 0, 0))
    RESULT["begin_us"] = (time.thread_time() - c0) / n * 1e6
    ev = CudaTimer(torch, 4096, anchor, main, api)
    c0 = time.thread_time()
    for i in range(20000):
        ev.end(ev.begin((i, 0, 0, 0, 0)))
        if i % 1000 == 999:
            ev.harvest([])
            torch.cuda.synchronize()
            ev.harvest([])
    RESULT["event_pair_us_incl_harvest"] = (time.thread_time() - c0) / 20000 * 1e6
    say(
        f"loop thread: CuptiTimer.begin {RESULT['begin_us']:.3f} us; CUDA event pair {RESULT['event_pair_us_incl_harvest']:.2f} us"
    )
    # decode cost per record on saved buffers
    bufs = [w[0] for w in walked] or []
    if bufs:
        recs = sum(len(w[1]) for w in walked)
        c0 = time.perf_counter()
        for _ in range(50):
            for b in bufs:
                cupti_activity.decode_buffer(b, dict(cp.sizes))
        RESULT["decode_us_per_record"] = (time.perf_counter() - c0) / (50 * recs) * 1e6
        say(f"decode {RESULT['decode_us_per_record']:.3f} us/record over {recs} records")
    RESULT["cupti_records"] = cp.records
    RESULT["cupti_errors"] = [cp.errors, cp.last_error, cp.lost_buffers, cp.dropped()]
    say(
        f"client: records {cp.records} errors {cp.errors} {cp.last_error} lost buffers {cp.lost_buffers} dropped {cp.dropped()}"
    )

    blob = b"".join(w[0] for w in walked)
    meta = []
    pos = 0
    for data, offs in walked:
        meta.append({"at": pos, "length": len(data), "offsets": offs})
        pos += len(data)
    with open(os.path.join(out_dir, "cupti_buffers.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(out_dir, "cupti_buffers.json"), "w") as f:
        json.dump(
            {
                "machine": "H200, driver 580, torch " + torch.__version__ + ", libcupti " + os.path.basename(cp.path),
                "sizes": RESULT["record_sizes"],
                "buffers": meta,
            },
            f,
            indent=1,
        )
    with open(os.path.join(out_dir, "cupti_timer_probe.json"), "w") as f:
        json.dump(RESULT, f, indent=1, default=str)
    cp.stop()
    dist.destroy_process_group()
    _ = np


def layouts(out_dir: str) -> None:
    """cupti-python's dtypes: offsets of the fields we read, and the saved records decoded with them."""
    import numpy as np
    from cupti import cupti

    from workers.rank.cupti_activity import KERNEL_FIELDS, MEMCPY_FIELDS

    names = {
        "copy_kind": "copy_kind",
        "src_kind": "src_kind",
        "dst_kind": "dst_kind",
        "bytes": "bytes",
        "start": "start",
        "end": "end",
        "device_id": "device_id",
        "stream_id": "stream_id",
        "correlation_id": "correlation_id",
        "name": "name",
    }
    ref = {1: cupti.activity_memcpy6_dtype, 10: cupti.activity_kernel10_dtype}
    ours = {1: MEMCPY_FIELDS, 10: KERNEL_FIELDS}
    ok = True
    for kind, dt in ref.items():
        say(f"kind {kind}: itemsize {dt.itemsize}; fields {sorted((v[1], k) for k, v in dt.fields.items())[:40]}")
        for ours_name, (off, _t) in ours[kind].items():
            f = dt.fields.get(names[ours_name])
            same = f is not None and f[1] == off
            ok &= same
            say(f"  {ours_name}: ours {off}, cupti-python {f[1] if f else None} {'ok' if same else 'DIFFERENT'}")
    RESULT["layouts_ok"] = ok
    meta = json.load(open(os.path.join(out_dir, "cupti_buffers.json")))
    blob = open(os.path.join(out_dir, "cupti_buffers.bin"), "rb").read()
    expect: dict[str, list[Any]] = {"memcpy": [], "kernel": []}
    for b in meta["buffers"]:
        data = blob[b["at"] : b["at"] + b["length"]]
        for off in b["offsets"]:
            kind = int.from_bytes(data[off : off + 4], "little")
            if kind not in ref:
                continue
            dt = ref[kind]
            rec = np.frombuffer(data[off : off + dt.itemsize].ljust(dt.itemsize, b"\0"), dtype=dt)[0]
            key = "memcpy" if kind == 1 else "kernel"
            expect[key].append({n: int(rec[names[n]]) for n in ours[kind]})
    meta["expected"] = expect
    json.dump(meta, open(os.path.join(out_dir, "cupti_buffers.json"), "w"), indent=1)
    say(f"reference decode: {len(expect['memcpy'])} memcpy, {len(expect['kernel'])} kernel records; layouts ok: {ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["capture", "layouts"])
    ap.add_argument("--out-dir", default=".")
    ns = ap.parse_args()
    {"capture": capture, "layouts": layouts}[ns.what](ns.out_dir)


if __name__ == "__main__":
    main()
