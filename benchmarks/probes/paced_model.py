"""The TUI's model (apply + snapshots, no sockets, no Textual) fed a steady stream, unpaced or
paced in real time with a given number of wake-ups per snapshot: how much the same work costs
when it is done in short pieces with sleeps between them, as the app's ingest thread does.

    python benchmarks/probes/paced_model.py RANKS SECONDS BATCH_MS WAKEUPS   (e.g. 64 24 100 1)

WAKEUPS = 0 runs as fast as it can (the cost of the work alone); 1 wakes once per snapshot
interval (the ingest loop since issue 28's 2026-12-04 evening change); 3 is about what it did
before (a wake for the first message after each snapshot, one when the snapshot was due, plus
the polls between). Prints the thread CPU of the measured second half, split into snapshots and
applies. VM, 2026-12-04, 64 ranks, 100 ms batches: 0 -> 3.9-5.1 %, 1 -> 5.8-8.8 %, 3 -> 8.5-9.5 %
of a core for the same work.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standing"))

from _synth_publisher import ALL_REDUCE, hello  # noqa: E402 - after the path

from tui.model.run_model import RunModel  # noqa: E402
from tui.model.snapshot_builder import TEXT_EVERY_S  # noqa: E402
from workers.wire import protocol as p  # noqa: E402

PER_RANK_S = 370  # records per second per rank, as render_scale
HZ = 15
T0 = 1_700_000_000_000_000_000


class _Sequence:
    """What ``hello`` reads of a publisher: its sequence numbers and drops."""

    def __init__(self) -> None:
        self.seq = {p.COLL: 0}
        self.dropped = 0


def schedule(ranks: int, seconds: float, batch_ms: float) -> list[tuple[int, p.Message]]:
    """(virtual arrival ns, decoded message): every rank's batches every ``batch_ms`` (staggered),
    a Hello per rank per second, each through the wire codec as the app receives it."""
    per_batch = max(1, round(PER_RANK_S * batch_ms / 1000))
    gap = int(batch_ms * 1e6 / per_batch)
    pool = np.random.default_rng(0).lognormal(np.log(64), 0.15, 1 << 16).astype(np.float32)
    offsets = np.arange(per_batch, dtype=np.int64)
    events: list[tuple[int, dict]] = []
    iteration = dict.fromkeys(range(ranks), 0)
    seq = dict.fromkeys(range(ranks), 0)
    t, k = T0, 0
    while t < T0 + int(seconds * 1e9):
        for r in range(ranks):
            at = t + int((r % 8) * batch_ms * 1e6 / 8)
            dur = pool[k : k + per_batch]
            k = (k + per_batch) % (len(pool) - per_batch)
            start = at - (per_batch - 1 - offsets) * gap - (dur * 1000).astype(np.int64)
            it = iteration[r] + offsets
            iteration[r] += per_batch
            bw = (4 / dur / 1e3).astype(np.float32)
            cols = {
                "iteration": it,
                "step": it >> 5,
                "epoch": np.zeros(per_batch, np.int32),
                "mode": np.zeros(per_batch, np.uint8),
                "op": np.full(per_batch, ALL_REDUCE, np.uint8),
                "group": np.zeros(per_batch, "<u2"),
                "dtype": np.zeros(per_batch, np.uint8),
                "nbytes": np.full(per_batch, 4, np.int64),
                "host_ns": start,
                "start_ns": start,
                "dur_us": dur,
                "algbw": bw,
                "busbw": bw,
            }
            events.append((at, p.batch_body(p.COLL, "s", p.Batch(p.COLL, r, seq[r], 0, cols, 0, -1, -1, at))))
            seq[r] += 1
        t += int(batch_ms * 1e6)
    for second in range(int(seconds) + 1):
        for r in range(ranks):
            pub = _Sequence()
            pub.seq[p.COLL] = seq[r]
            h = hello(r, ranks, T0, 0, pub)  # type: ignore[arg-type]
            h = h.__class__(**{**h.__dict__, "t_ns": T0 + second * 10**9})
            events.append((T0 + second * 10**9 + r * 1000, p.hello_body("s", h)))
    events.sort(key=lambda e: e[0])
    return [(at, p.decode(body)) for at, body in events]


def run(model: RunModel, clock: list[int], messages: list, wakeups: int, next_snap: int) -> tuple[float, float, int]:
    """Apply ``messages`` with a snapshot every 1/HZ s of virtual time; with ``wakeups`` > 0,
    sleep until each 1/(HZ x wakeups) slice of virtual time is due on the wall clock first.
    Returns (snapshot CPU s, apply CPU s, the next snapshot's virtual time)."""
    every = int(1e9 / HZ)
    slice_ns = every // wakeups if wakeups else 0
    wall0, virt0 = time.perf_counter(), messages[0][0]
    next_wake = virt0 + slice_ns
    snap_s = apply_s = 0.0
    for at, message in messages:
        if wakeups and at >= next_wake:
            wait = wall0 + (next_wake - virt0) / 1e9 - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            next_wake += slice_ns
        while at >= next_snap:
            clock[0] = next_snap
            c = time.thread_time()
            model.snapshot(next_snap, text_every_s=TEXT_EVERY_S)
            snap_s += time.thread_time() - c
            next_snap += every
        clock[0] = at
        c = time.thread_time()
        model.apply(message, at)
        apply_s += time.thread_time() - c
    return snap_s, apply_s, next_snap


def main() -> None:
    ranks, seconds, batch_ms, wakeups = (int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
    messages = schedule(ranks, seconds, batch_ms)
    clock = [T0]
    model = RunModel(clock=lambda: clock[0])
    model.whole_run_stats = ranks < 64  # the heat map is shown from 64 ranks on a 50-line terminal
    half = len(messages) // 2
    _, _, next_snap = run(model, clock, messages[:half], wakeups, T0 + int(1e9 / HZ))  # warm-up
    snap_s, apply_s, _ = run(model, clock, messages[half:], wakeups, next_snap)
    span_s = (messages[-1][0] - messages[half][0]) / 1e9
    print(
        f"{ranks} ranks, {batch_ms:g} ms batches, {wakeups} wake-ups per snapshot: snapshots {snap_s:.3f} s + "
        f"applies {apply_s:.3f} s of thread CPU over {span_s:.1f} s = {100 * (snap_s + apply_s) / span_s:.1f} % of a core"
    )


if __name__ == "__main__":
    main()
