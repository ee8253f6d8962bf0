"""The live model's overlap classes: collectives wait for copies that arrive later, then get
the same labels as the offline classifier; memory stays bounded."""

from __future__ import annotations

import numpy as np

from tui.model import overlap_live
from tui.model.overlap_live import RankOverlap
from tui.model.run_model import RunModel
from workers.wire.overlap import CLASSES, classify, end_ns
from workers.wire.protocol import COLL, COLL_COLUMNS, COPY, COPY_COLUMNS, Batch


def coll_cols(steps: list[int], starts: list[int], dur_us: float = 10.0, epoch: int = 0) -> dict[str, np.ndarray]:
    n = len(steps)
    cols = {name: np.zeros(n, dtype=dt) for name, dt in COLL_COLUMNS.items()}
    cols["iteration"] = np.arange(n, dtype=np.int64) + 10 * steps[0]
    cols["step"] = np.array(steps, dtype=np.int64)
    cols["epoch"] = np.full(n, epoch, dtype=np.int32)
    cols["start_ns"] = np.array(starts, dtype=np.int64)
    cols["dur_us"] = np.full(n, dur_us, dtype=np.float32)
    return cols


def copy_cols(steps: list[int], starts: list[int], dur_us: float) -> dict[str, np.ndarray]:
    n = len(steps)
    cols = {name: np.zeros(n, dtype=dt) for name, dt in COPY_COLUMNS.items()}
    cols["step"] = np.array(steps, dtype=np.int64)
    cols["start_ns"] = np.array(starts, dtype=np.int64)
    cols["dur_us"] = np.full(n, dur_us, dtype=np.float32)
    cols["nbytes"] = np.full(n, 1 << 20, dtype=np.int64)
    return cols


def counts(ov: RankOverlap) -> dict[str, int]:
    return {name: st.count for name, st in ov.stats().items()}


def test_a_copy_that_arrives_after_its_collective_still_makes_it_during() -> None:
    ov = RankOverlap()
    # step 0: a copy 0..25 us overlaps the first collective (0..10 us) and the second (20..30 us)
    ov.add_coll(coll_cols([0, 0, 0], [0, 20_000, 40_000]))
    assert ov.pending == 3 and counts(ov) == {}  # nothing is labelled before its copies are known
    ov.add_coll(coll_cols([1, 1], [60_000, 80_000]))
    ov.add_copy(copy_cols([0], [0], 25.0))  # the copy of step 0 arrives late
    ov.add_copy(copy_cols([1], [100_000], 1.0))  # a later step's copy: step 0 is settled
    assert counts(ov) == {"during copies": 2, "after copies": 1}
    assert ov.pending == 2
    assert abs(ov.overlapped() - (1.0 + 0.5) / 2) < 1e-6
    ov.flush()  # step 1's collectives ran before its copy (100 us): no copies
    assert counts(ov) == {"during copies": 2, "after copies": 1, "no copies": 2}


def test_without_copies_collectives_settle_two_steps_behind() -> None:
    ov = RankOverlap()
    for step in range(5):
        ov.add_coll(coll_cols([step] * 4, [step * 1000 + i * 100 for i in range(4)]))
    # after step 4's batch, steps <= 3 - 2 = 1 are settled (the lag is one batch)
    assert counts(ov) == {"no copies": 8} and ov.pending == 12


def test_pending_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(overlap_live, "MAX_PENDING", 100)
    ov = RankOverlap()
    ov.add_coll(coll_cols([0] * 250, list(range(0, 250_000, 1000))))  # one step that never ends
    assert ov.pending == 100 and counts(ov) == {"no copies": 150}


def test_live_labels_equal_the_offline_classifier_on_random_batches() -> None:
    rng = np.random.default_rng(11)
    ov = RankOverlap()
    all_c, all_p = [], []
    t = 0
    for step in range(60):
        n_copy = int(rng.integers(0, 3))
        # times in ns: a step every 6 ms, collectives 1 ms apart, copies of up to 4 ms that may
        # run into the next step
        cs = sorted(t + int(rng.integers(0, 3_000_000)) for _ in range(n_copy))
        cp = copy_cols([step] * n_copy, cs, float(rng.integers(1, 4000))) if n_copy else None
        starts = [t + 1_000_000 * i + int(rng.integers(0, 500_000)) for i in range(5)]
        cc = coll_cols([step] * 5, starts, dur_us=float(rng.integers(1, 900)))
        ov.add_coll(cc)
        all_c.append(cc)
        if cp is not None:
            ov.add_copy(cp)
            all_p.append(cp)
        t += 6_000_000
    ov.flush()
    c = {k: np.concatenate([x[k] for x in all_c]) for k in ("start_ns", "dur_us", "step")}
    p = {k: np.concatenate([x[k] for x in all_p]) for k in ("start_ns", "dur_us", "step")}
    cls, _ = classify(
        c["start_ns"], end_ns(c["start_ns"], c["dur_us"]), c["step"],
        p["start_ns"], end_ns(p["start_ns"], p["dur_us"]), p["step"],
    )  # fmt: skip
    want = {CLASSES[k]: int(v) for k, v in zip(*np.unique(cls, return_counts=True), strict=True)}
    assert counts(ov) == want and len(want) == 3


def test_run_model_shows_classes_per_rank() -> None:
    model = RunModel(clock=lambda: 10**18)
    model.apply(Batch(COLL, 0, 0, 0, coll_cols([0, 0], [0, 50_000])))
    model.apply(Batch(COPY, 0, 0, 0, copy_cols([0], [0], 20.0)))
    model.apply(Batch(COLL, 1, 0, 0, coll_cols([0, 0], [0, 50_000])))  # rank 1: no copies
    snap = model.snapshot(fresh_run_stats=True)
    by_rank = {r.rank: {k: v.count for k, v in r.run_by_class.items()} for r in snap.ranks}
    assert by_rank == {0: {"during copies": 1, "after copies": 1}, 1: {"no copies": 2}}
