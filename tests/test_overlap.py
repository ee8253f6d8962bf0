"""Overlap classes against labels computed by hand on synthetic intervals."""

from __future__ import annotations

import numpy as np

from workers.wire.overlap import AFTER, DURING, NO_COPIES, classify, classify_ranks, copy_union


def _arr(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_during_after_and_no_copies_in_one_step_layout() -> None:
    # step 0: a copy 0..100; collectives 50..150 (during, half), 150..200 (after)
    # step 1: no copies; collective 300..400 (no copies)
    cls, frac = classify(_arr(50, 150, 300), _arr(150, 200, 400), _arr(0, 0, 1), _arr(0), _arr(100), _arr(0))
    assert cls.tolist() == [DURING, AFTER, NO_COPIES]
    assert frac.tolist() == [0.5, 0.0, 0.0]


def test_touching_intervals_do_not_overlap() -> None:
    # copy 0..100; a collective 100..200 touches its end, one -50..0 touches its start
    cls, frac = classify(_arr(100, -50), _arr(200, 0), _arr(0, 0), _arr(0), _arr(100), _arr(0))
    assert cls.tolist() == [AFTER, NO_COPIES]  # the second ran before its step's copy
    assert frac.tolist() == [0.0, 0.0]


def test_nested_both_ways() -> None:
    # a collective inside a copy (fraction 1); a copy inside a collective (fraction 0.1)
    cls, frac = classify(_arr(10, 1000), _arr(20, 2000), _arr(0, 1), _arr(0, 1500), _arr(100, 1600), _arr(0, 1))
    assert cls.tolist() == [DURING, DURING]
    assert np.allclose(frac, [1.0, 0.1])


def test_several_copies_overlapping_each_other_count_once() -> None:
    # copies 0..100, 50..150, 300..400 (union 0..150, 300..400); collective 100..350
    cls, frac = classify(_arr(100), _arr(350), _arr(0), _arr(0, 50, 300), _arr(100, 150, 400), _arr(0, 0, 0))
    assert cls.tolist() == [DURING]
    assert np.isclose(frac[0], (50 + 50) / 250)
    s, e, before = copy_union(_arr(300, 0, 50), _arr(400, 100, 150))
    assert s.tolist() == [0, 300] and e.tolist() == [150, 400] and before.tolist() == [0, 150]


def test_copy_of_previous_step_still_running_is_during() -> None:
    # step 0 copy 0..500 runs into step 1, whose collective 400..600 has no copies of its own
    cls, frac = classify(_arr(400), _arr(600), _arr(1), _arr(0), _arr(500), _arr(0))
    assert cls.tolist() == [DURING] and np.isclose(frac[0], 0.5)


def test_after_needs_every_copy_of_the_step_finished() -> None:
    # step 0 copies 0..100 and 900..1000 (the second after the collective): not "after"
    cls, _ = classify(_arr(200), _arr(300), _arr(0), _arr(0, 900), _arr(100, 1000), _arr(0, 0))
    assert cls.tolist() == [NO_COPIES]


def test_zero_length_collective_inside_a_copy() -> None:
    cls, frac = classify(_arr(50, 100), _arr(50, 100), _arr(0, 0), _arr(0), _arr(100), _arr(0))
    assert cls.tolist() == [DURING, AFTER]
    assert frac.tolist() == [1.0, 0.0]


def test_copies_of_another_rank_do_not_count() -> None:
    # rank 0 has no copies; rank 1 copies 0..1000 over the same time
    cls, frac = classify_ranks(
        np.array([0, 1]), _arr(100, 100), _arr(200, 200), _arr(0, 0), np.array([1]), _arr(0), _arr(1000), _arr(0)
    )
    assert cls.tolist() == [NO_COPIES, DURING]
    assert frac.tolist() == [0.0, 1.0]


def test_many_ranks_match_per_rank_classification() -> None:
    rng = np.random.default_rng(3)
    n, m = 400, 120
    cr, pr = rng.integers(0, 4, n), rng.integers(0, 4, m)
    cs = rng.integers(0, 10_000, n)
    ps = rng.integers(0, 10_000, m)
    ce, pe = cs + rng.integers(0, 300, n), ps + rng.integers(1, 300, m)
    cst, pst = cs // 1000, ps // 1000
    cls, frac = classify_ranks(cr, cs, ce, cst, pr, ps, pe, pst)
    for r in range(4):
        a, b = cr == r, pr == r
        c2, f2 = classify(cs[a], ce[a], cst[a], ps[b], pe[b], pst[b])
        assert cls[a].tolist() == c2.tolist() and np.allclose(frac[a], f2)
    # brute force on one rank
    for k in np.flatnonzero(cr == 0)[:50]:
        mine = pr == 0
        ov = sum(max(0, min(ce[k], e) - max(cs[k], s)) for s, e in zip(ps[mine], pe[mine], strict=True))
        if cls[k] == DURING and ce[k] > cs[k]:
            assert ov > 0  # union <= sum, and > 0 exactly when some copy overlaps
        if ov > 0:
            assert cls[k] == DURING
