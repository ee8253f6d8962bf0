"""Which of the capture's activities line up with the job's slow steps (run under commtop).

    commtop run --headless --nproc 1 -- python benchmarks/probes/capture_timeline.py OUT.json \\
        benchmarks/jobs/ddp_offload.py --steps 1200 --warmup 50

Runs the job script (``ddp_offload.py`` with ``--step-log``) in this process. Once the job's
``init_process_group`` returns, the capture thread (``commtop-capture``) is running: its
Flight Recorder status polls and reads, CUPTI flushes and sends are wrapped to log each one's
start, end (``time.perf_counter``, the job's step clock) and the capture thread's CPU time.
At the end, each step is matched with the activities that overlap it, and the probe prints,
per activity: how many steps it touched, their mean length against the untouched steps', and
the time it added in all (steps touched x their excess over the untouched median). Slow
steps (over 1.3x the median) that no activity touched are counted too: the share of the cost
that is not the capture thread's (NCCL timing, CUPTI on the driver's side, other processes).
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

EVENTS: list[tuple[str, float, float, float]] = []  # (kind, start s, end s, capture-thread CPU s)


def _timed(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((kind, t0, time.perf_counter(), time.thread_time() - c0))

    return wrapper


def instrument() -> str:
    """Wrap the running capture thread's parts; returns what was found."""
    for t in threading.enumerate():
        if t.name == "commtop-capture":
            capture = t._target.__self__  # type: ignore[attr-defined]  # CaptureThread._run
            break
    else:
        return "no commtop-capture thread (not under commtop's Flight Recorder capture)"
    found = []
    fr = capture.fr
    if fr is not None:
        fr.poll = _timed("status poll", fr.poll)
        fr.read = _timed("ring read", fr.read)
        found.append("flight recorder")
    if capture.copies is not None:
        capture.copies.flush = _timed("cupti flush", capture.copies.flush)
        found.append("cupti")
    mon = capture.mon
    mon.add_coll_array = _timed("send collectives", mon.add_coll_array)
    mon.add_records = _timed("send copies", mon.add_records)
    return ", ".join(found)


def analyse(ends: list[float], durs: list[float]) -> dict[str, Any]:
    steps = [(e - d, e, d) for e, d in zip(ends, durs, strict=True)]
    touched: dict[int, set[str]] = {}
    events = sorted(EVENTS, key=lambda e: e[1])
    for kind, t0, t1, _cpu in events:
        for i, (s0, s1, _d) in enumerate(steps):
            if s0 < t1 and t0 < s1:
                touched.setdefault(i, set()).add(kind)
    clean = [d for i, (_a, _b, d) in enumerate(steps) if i not in touched]
    base = statistics.median(clean) if clean else statistics.median(durs)
    out: dict[str, Any] = {
        "steps": len(steps),
        "step_ms_median_untouched": round(base * 1e3, 4),
        "step_ms_mean": round(statistics.fmean(durs) * 1e3, 4),
        "excess_ms_total": round(sum(d - base for d in durs) * 1e3, 2),
    }
    kinds = sorted({e[0] for e in events})
    per: dict[str, Any] = {}
    for kind in kinds:
        mine = [e for e in events if e[0] == kind]
        hit = [steps[i][2] for i, ks in touched.items() if kind in ks]
        per[kind] = {
            "count": len(mine),
            "wall_ms_mean": round(statistics.fmean(e[2] - e[1] for e in mine) * 1e3, 3),
            "wall_ms_max": round(max(e[2] - e[1] for e in mine) * 1e3, 3),
            "cpu_ms_total": round(sum(e[3] for e in mine) * 1e3, 2),
            "steps_touched": len(hit),
            "touched_step_ms_mean": round(statistics.fmean(hit) * 1e3, 4) if hit else None,
            "excess_ms_total": round(sum(d - base for d in hit) * 1e3, 2),
        }
    out["by_activity"] = per
    slow = [i for i, (_a, _b, d) in enumerate(steps) if d > 1.3 * base]
    out["slow_steps"] = len(slow)
    out["slow_untouched"] = sum(1 for i in slow if i not in touched)
    out["excess_ms_untouched"] = round(
        sum(d - base for i, (_a, _b, d) in enumerate(steps) if i not in touched) * 1e3, 2
    )
    return out


def main() -> int:
    if len(sys.argv) < 3:
        raise SystemExit("usage: capture_timeline.py OUT.json JOB.py [JOB ARGS]")
    out_path, job, job_args = sys.argv[1], sys.argv[2], sys.argv[3:]
    step_log = out_path + ".steps.json"
    import torch.distributed as dist

    original = dist.init_process_group
    found: list[str] = []

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        found.append(instrument())
        return result

    dist.init_process_group = init_process_group  # type: ignore[assignment]
    sys.argv = [job, *job_args, "--step-log", step_log]
    sys.path[0] = os.path.dirname(os.path.abspath(job))
    try:
        runpy.run_path(job, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    with open(step_log) as f:
        log = json.load(f)
    result = {"instrumented": found, **analyse(log["end_s"], log["dur_s"])}
    # the raw timeline too, and the offset of perf_counter to time.time_ns (to line up with a recording)
    a = time.time_ns()
    b = time.perf_counter()
    result["raw"] = {"perf_to_epoch_ns": a - int(b * 1e9), "events": EVENTS, "steps_end_s": log["end_s"]}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print("capture_timeline: " + json.dumps({k: v for k, v in result.items() if k != "raw"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
