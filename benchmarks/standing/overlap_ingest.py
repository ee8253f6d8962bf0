"""What labelling collectives with their overlap class costs in the TUI's ingest, per record
(target < 0.2 us), against the whole model ingest of the same batches measured in the same run.

    python benchmarks/standing/overlap_ingest.py

Streams are generated like a worker sends them (a batch every 50 ms): the forum loop (32
collectives of 66 us and 5 copies of 2.4 ms per step), collectives only (no copies), and small
batches (a slow job: a batch of 8 collectives).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _common import Report, add_common_args, finish

from tui.model.overlap_live import RankOverlap
from tui.model.run_model import RunModel
from workers.wire.protocol import COLL, COLL_COLUMNS, COPY, COPY_COLUMNS, Batch

TARGET_US = 0.2


def stream(steps: int, per_step: int, copies: int, coll_us: float, copy_us: float, batch_steps: int) -> list[Batch]:
    """Batches of one rank: collectives then copies of ``batch_steps`` steps at a time."""
    out: list[Batch] = []
    rng = np.random.default_rng(0)
    t0 = 1_800_000_000_000_000_000
    step_ns = int(max(per_step * coll_us, copies * copy_us) * 1e3) + 10_000
    seq = 0
    for s0 in range(0, steps, batch_steps):
        ss = np.arange(s0, min(steps, s0 + batch_steps))
        n = len(ss) * per_step
        c = {name: np.zeros(n, dtype=dt) for name, dt in COLL_COLUMNS.items()}
        c["step"] = np.repeat(ss, per_step)
        c["iteration"] = np.arange(s0 * per_step, s0 * per_step + n)
        c["start_ns"] = t0 + c["step"] * step_ns + np.tile(np.arange(per_step), len(ss)) * int(coll_us * 1e3)
        c["dur_us"] = (coll_us * np.exp(rng.normal(0, 0.05, n))).astype(np.float32)
        out.append(Batch(COLL, 0, seq, 0, c))
        if copies:
            m = len(ss) * copies
            p = {name: np.zeros(m, dtype=dt) for name, dt in COPY_COLUMNS.items()}
            p["step"] = np.repeat(ss, copies)
            p["start_ns"] = t0 + p["step"] * step_ns + np.tile(np.arange(copies), len(ss)) * int(copy_us * 1e3)
            p["dur_us"] = np.full(m, copy_us, dtype=np.float32)
            p["nbytes"] = np.full(m, 128 << 20, dtype=np.int64)
            out.append(Batch(COPY, 0, seq, 0, p))
        seq += 1
    return out


def per_record_us(batches: list[Batch], repeats: int) -> tuple[float, float, int]:
    """(overlap labelling, whole RunModel.apply) in us per collective record; best of ``repeats``."""
    n = sum(len(b) for b in batches if b.kind == COLL)
    label, whole = [], []
    for _ in range(repeats):
        ov = RankOverlap()
        t = time.process_time()
        for b in batches:
            if b.kind == COLL:
                ov.add_coll(b.columns)
            else:
                ov.add_copy(b.columns)
        ov.flush()
        label.append((time.process_time() - t) / n * 1e6)
        model = RunModel(clock=lambda: 1_800_000_000_000_000_000)
        t = time.process_time()
        for b in batches:
            model.apply(b, 1_800_000_000_000_000_000)
        whole.append((time.process_time() - t) / n * 1e6)
    return min(label), statistics.median(whole), n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ns = ap.parse_args(argv)
    steps = 40 if ns.tiny else 4000
    repeats = 2 if ns.tiny else 7
    cases = (
        ("forum loop: 32 x 66 us + 5 copies of 2.4 ms per step, 4 steps per batch", 32, 5, 66.0, 2400.0, 4),
        ("collectives only: 66 us, 750 per batch", 750, 0, 66.0, 0.0, 1),
        ("slow job: 8 collectives + 1 copy per step and batch", 8, 1, 5000.0, 20000.0, 1),
    )
    report = Report("overlap classes in the TUI ingest: cost per collective record")
    table = report.table(
        "per collective record, best of repeats (labelling) / median (whole model ingest, labelling included)",
        ("stream", "records", "labelling us", "whole ingest us", "labelling share", "target", "met"),
    )
    for name, per_step, copies, coll_us, copy_us, batch_steps in cases:
        batches = stream(steps if per_step < 100 else steps // 20, per_step, copies, coll_us, copy_us, batch_steps)
        label, whole, n = per_record_us(batches, repeats)
        table.add(name, n, label, whole, f"{label / whole * 100:.0f} %", f"< {TARGET_US}", label < TARGET_US)
    report.notes.append(
        "labelling = tui.model.overlap_live.RankOverlap (pending buffer + workers.wire.overlap.classify + per-class "
        "aggregates); whole ingest = tui.model.run_model.RunModel.apply of the same batches, which includes it"
    )
    report.notes.append(
        "times are CPU time of this process (time.process_time), best of the repeats for the labelling: on a "
        "shared, overloaded machine wall time mostly measures waiting for a core"
    )
    finish(report, ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
