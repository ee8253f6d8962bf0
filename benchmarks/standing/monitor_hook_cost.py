"""What the monitor's torch.distributed wrappers cost the job's thread per collective (gloo, CPU).

    python3 benchmarks/standing/monitor_hook_cost.py --out $OUT/monitor_hook_cost.md

The path every collective of an unmodified gloo job takes under commtop (workers.capture's
fallback, and ``workers.monitor.patch_distributed``): ``coll_begin`` (op, bytes, the group's code
and size, the dtype's code, the record's meta) + ``coll_end`` (the row, a harvest every 64 and
the batches sent to a real PULL socket), on a world of one, measured without the collective
itself; then the whole patched call against torch's original on a small all_reduce, in
interleaved blocks. Target: < 2 µs of job-thread CPU per record. Same-run reference: one
``time.time_ns()`` call; each row says how many of those it costs.

The calls whose record ends at the job's own wait (workers.monitor.wait_hook) add two tables: a
functional collective's begin + end (its group a ProcessGroup or a DeviceMesh) and its whole
call, and what the wrapped ``Work.wait`` and ``wait_tensor`` cost a wait when nothing is
outstanding (every wait of a job after its first gloo isend or functional collective). Under the
Flight Recorder capture with a gloo side group (workers.capture.gloo_side) a collective on an NCCL
group goes through the wrapper and is left alone: a table of what that costs.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from typing import Any

from _common import Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]

TARGET_US = 2.0


def per_call_us(fn: Any, n: int) -> float:
    c = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - c) / n * 1e6


class _NoRecord:
    """The end of a record this benchmark does not keep (wait_hook.Awaited)."""

    def done(self) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--n", type=int, default=0, help="records per measure (default 200,000; tiny 2,000)")
    ns = ap.parse_args(argv)
    n = ns.n or (2_000 if ns.tiny else 200_000)
    os.environ.setdefault("COMMTOP_RUNTIME_DIR", tempfile.mkdtemp(prefix="cmh-", dir="/tmp"))
    import torch
    import torch.distributed as dist
    import zmq

    from workers import monitor
    from workers.monitor import patch as monitor_patch
    from workers.wire import connection as connections
    from workers.wire import protocol

    conn = connections.create_run(label="hook-cost")
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES + 1024)
    pull.setsockopt(zmq.RCVHWM, 1_000_000)
    pull.bind(conn.data)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    second = dist.new_group([0])
    mon = monitor.start(conn.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    spec = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    f32, bf16 = torch.ones(256), torch.ones(256, dtype=torch.bfloat16)
    begin, end = mon.coll_begin, mon.coll_end

    report = Report("the monitor's wrappers: job-thread CPU per collective (gloo, world of one)")
    table = report.table(
        f"µs of job-thread CPU per record ({n:,} each, best of 3); reference: time.time_ns() in the same run",
        ("call", "µs", "x reference", "target", "met"),
    )
    ref_us = min(per_call_us(time.time_ns, n) for _ in range(3))
    table.add("time.time_ns() (reference)", ref_us, 1.0, "", "")
    for label, args, kwargs in (
        ("coll_begin + coll_end: float32, default group", (f32,), {}),
        ("coll_begin + coll_end: float32, a second group", (f32,), {"group": second}),
        ("coll_begin + coll_end: bfloat16, a second group", (bf16,), {"group": second}),
    ):
        us = min(per_call_us(lambda a=args, k=kwargs: end(begin(spec, a, k), None), n) for _ in range(3))
        table.add(label, us, us / ref_us, f"< {TARGET_US:g} µs", us < TARGET_US)
    mon.harvest()

    calls, blocks = (200, 4) if ns.tiny else (2_000, 15)
    original = monitor_patch._originals["all_reduce"]
    interleaved(
        report,
        f"a gloo all_reduce of 1 KiB on a second group, job-thread CPU per call (median of {blocks} "
        f"interleaved blocks of {calls:,})",
        ("torch's dist.all_reduce (unpatched)", "difference: the wrapper"),
        (lambda: dist.all_reduce(f32, group=second), lambda: original(f32, group=second)),
        (calls, blocks, ref_us),
        mon.harvest,
    )
    _left_to_the_flight_recorder(report, n, ref_us, (calls, blocks), mon, spec, second, f32)
    _wait_paths(report, n, ref_us, calls, blocks, second, f32, begin, end, mon)
    monitor.stop()
    received = 0
    while pull.poll(200):
        body = protocol.decode(protocol.open_frames(conn.key, pull.recv_multipart(), conn.session))
        if isinstance(body, protocol.Batch) and body.kind == protocol.COLL:
            received += len(body)
    report.notes.append(f"records sent and received by the PULL socket: {received:,} (dropped {mon.publisher.dropped})")
    dist.destroy_process_group()
    finish(report, ns)
    return 0


def interleaved(
    report: Any, title: str, labels: tuple[str, str], fns: tuple[Any, Any], sizes: tuple[int, int, float], between: Any
) -> None:
    """A table of ``fns`` (patched, torch's) timed in interleaved blocks: medians and difference."""
    calls, blocks, ref_us = sizes
    on: list[float] = []
    off: list[float] = []
    for _ in range(blocks):
        for fn, out in zip(fns, (on, off), strict=True):
            c = time.thread_time()
            for _ in range(calls):
                fn()
            out.append((time.thread_time() - c) / calls * 1e6)
        between()
    table = report.table(title, ("call", "µs", "x reference"))
    m_on, m_off = statistics.median(on), statistics.median(off)
    table.add(labels[0], m_off, m_off / ref_us)
    table.add("patched, under the monitor", m_on, m_on / ref_us)
    table.add(labels[1], m_on - m_off, (m_on - m_off) / ref_us)


def _left_to_the_flight_recorder(report: Any, n: int, ref_us: float, sizes: tuple[int, int], *held: Any) -> None:
    """Under the Flight Recorder capture with the wrappers in for a gloo side group
    (workers.capture.gloo_side): what a collective on a group that is not gloo's (an NCCL group,
    played here by a second gloo group marked so) costs the job's thread to be left alone."""
    import torch.distributed as dist

    from workers.monitor import patch as monitor_patch

    mon, spec, second, f32 = held
    calls, blocks = sizes
    code = mon.groups.by_pg[second][0]
    mon.timers.gloo_only, mon.timers.unseen._gloo_codes[code] = True, False
    begin, end = mon.coll_begin, mon.coll_end
    table = report.table(
        f"a collective left to the Flight Recorder (gloo-only hooks), µs of job-thread CPU ({n:,} each, best of 3)",
        ("call", "µs", "x reference"),
    )
    us = min(per_call_us(lambda: end(begin(spec, (f32,), {"group": second}), None), n) for _ in range(3))
    table.add("coll_begin + coll_end: a group not gloo's (no record)", us, us / ref_us)
    original = monitor_patch._originals["all_reduce"]
    interleaved(
        report,
        f"that collective's whole call (a 1 KiB all_reduce; median of {blocks} interleaved blocks of {calls:,})",
        ("torch's dist.all_reduce (unpatched)", "difference: the wrapper's check"),
        (lambda: dist.all_reduce(f32, group=second), lambda: original(f32, group=second)),
        (calls, blocks, ref_us),
        mon.harvest,
    )
    mon.timers.gloo_only = False


def _wait_paths(report: Any, n: int, ref_us: float, calls: int, blocks: int, *held: Any) -> None:
    """Functional collectives and the wrapped waits (see the module docstring)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    from workers.monitor import patch as monitor_patch
    from workers.monitor import wait_hook

    second, f32, begin, end, mon = held
    mesh = init_device_mesh("cpu", (1,))
    table = report.table(
        f"a functional collective's begin + end, µs of job-thread CPU ({n // 10:,} each, best of 3)",
        ("call", "µs", "x reference", "target", "met"),
    )
    spec = monitor_patch.funcol_spec("all_reduce", "all_reduce", monitor_patch._funcol_originals["funcol.all_reduce"])
    for label, group in (("its group a ProcessGroup", second), ("its group a DeviceMesh", mesh)):
        us = min(per_call_us(lambda g=group: end(begin(spec, (f32, "sum", g), {}), f32), n // 10) for _ in range(3))
        table.add(f"funcol all_reduce, {label}", us, us / ref_us, f"< {TARGET_US:g} µs", us < TARGET_US)
    mon.harvest()
    original = monitor_patch._funcol_originals["funcol.all_reduce"]
    plain_tensor = monitor_patch._funcol_originals["funcol.wait_tensor"]
    interleaved(
        report,
        f"a funcol all_reduce of 1 KiB and its wait_tensor, job-thread CPU per call (median of {blocks} "
        f"interleaved blocks of {calls // 4:,})",
        ("torch's funcol.all_reduce + wait_tensor (unpatched)", "difference: the wrappers"),
        (
            lambda: funcol.wait_tensor(funcol.all_reduce(f32, "sum", second)),
            lambda: plain_tensor(original(f32, "sum", second)),
        ),
        (calls // 4, blocks, ref_us),
        mon.harvest,
    )

    work = dist.all_reduce(f32, group=second, async_op=True)
    assert work is not None
    wait_hook.expect(work, _NoRecord())  # wraps Work.wait, as a gloo isend's first Work does
    work.wait()
    waits = report.table(
        f"a wait with nothing outstanding, µs of job-thread CPU ({n:,} each, best of 3)",
        ("call", "µs", "x reference"),
    )
    plain_wait = type(work).wait.__wrapped__  # torch's, under functools.wraps
    for label, fn in (
        ("Work.wait() of a finished Work, torch's", lambda: plain_wait(work)),
        ("Work.wait() of a finished Work, wrapped", work.wait),
        ("wait_tensor of a plain tensor, torch's", lambda: plain_tensor(f32)),
        ("wait_tensor of a plain tensor, wrapped", lambda: funcol.wait_tensor(f32)),
    ):
        us = min(per_call_us(fn, n) for _ in range(3))
        waits.add(label, us, us / ref_us)


if __name__ == "__main__":
    raise SystemExit(main())
