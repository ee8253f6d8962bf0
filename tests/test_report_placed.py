"""tui.report.placed: the values at the report's percentile positions, found through a
histogram of their bits, are the sorted array's, for every part and the whole, and the arrays
stay permutations of the values."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tui.report import kernels
from tui.report import placed as placed_module
from tui.report.placed import placed
from workers.wire.stats import order_positions, percentiles_and_max_sorted

QS = (50, 90, 99)
#: Few distinct values (ties across bins and inside one), the extremes of float32, and zero.
ODD = np.array([0.0, 1e-45, 1e-30, 1.5, 2.5, 7.0, 2700.25, 3e38], dtype=np.float32)


def _check(got: np.ndarray, values: np.ndarray) -> None:
    want = np.sort(values)
    assert np.sort(got).tobytes() == want.tobytes()  # a permutation
    kth = order_positions(len(values), QS)
    assert got[kth].tobytes() == want[kth].tobytes()
    assert repr(percentiles_and_max_sorted(got, QS)) == repr(percentiles_and_max_sorted(want, QS))


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6).filter(lambda s: sum(s) > 0),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["lognormal", "odd", "narrow", "one value"]),
)
def test_every_part_and_the_whole_hold_the_sorted_values_where_the_report_reads(sizes, seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    if kind == "lognormal":
        values = rng.lognormal(8, 0.3, n).astype(np.float32)
    elif kind == "odd":
        values = rng.choice(ODD, n)
    elif kind == "narrow":  # neighbouring floats: a bin per value, no shift
        values = (np.float32(2700.0) + rng.integers(0, 40, n).astype(np.float32) * np.float32(2.0**-12)).astype(
            np.float32
        )
    else:
        values = np.full(n, 3.5, dtype=np.float32)
    starts = np.cumsum([0, *sizes]).tolist()
    before = values.copy()
    with mock.patch.object(placed_module, "CROWDED", 0):  # placed however the values crowd
        found = placed(values, starts, QS)
    assert found is not None
    by_part, whole = found
    assert values.tobytes() == before.tobytes()  # the input is left as it was
    _check(whole, values)
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        if b > a:
            _check(by_part[a:b], values[a:b])
    if len(sizes) == 1:
        assert by_part is whole


@given(kind=st.sampled_from(["all equal", "two values", "one far outlier"]), parts=st.integers(1, 4))
@settings(max_examples=12, deadline=None)
def test_values_crowded_into_the_wanted_bins_are_left_to_a_sort(kind: str, parts: int) -> None:
    """All equal, a few distinct values, or one far outlier that makes every bin wide: the
    wanted bins hold most values, picking among them would cost more than a sort, so ``placed``
    says None and the report's order sorts them (the same percentiles)."""
    rng = np.random.default_rng(1)
    n = 40_000
    if kind == "all equal":
        values = np.full(n, 2700.0, dtype=np.float32)
    elif kind == "two values":
        values = rng.choice(np.array([2700.0, 5400.0], dtype=np.float32), n)
    else:
        values = rng.uniform(2700.0, 2700.5, n).astype(np.float32)
        values[7] = np.float32(3e38)
    starts = np.linspace(0, n, parts + 1).astype(int).tolist()
    assert placed(values, starts, QS) is None
    with mock.patch.object(kernels, "_CHOOSE_AT", 0), mock.patch.object(kernels, "_placing_is_faster", lambda: True):
        by_part, whole = kernels._in_order(values, starts)
    assert whole.tobytes() == np.sort(values).tobytes()  # sorted, not placed
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        assert by_part[a:b].tobytes() == np.sort(values[a:b]).tobytes()


def test_spread_values_are_placed_not_sorted() -> None:
    """Durations as a GPU gives them (spread over thousands of bins): placed, and not sorted."""
    values = np.random.default_rng(2).lognormal(np.log(2700.0), 0.08, 100_000).astype(np.float32)
    found = placed(values, [0, 50_000, 100_000], QS)
    assert found is not None
    by_part, whole = found
    _check(whole, values)
    assert whole.tobytes() != np.sort(values).tobytes()


def test_a_wide_range_of_values_is_binned_by_the_high_bits() -> None:
    """Values over the whole float32 range (more than 2^16 apart in their bits): the bins are
    coarse, the wanted bins' values sorted, still exact."""
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.lognormal(0, 20, 50_000), [0.0, 3e38]]).astype(np.float32)
    values = values[np.isfinite(values)]
    starts = [0, 20_000, 20_000, len(values)]
    found = placed(values, starts, QS)
    assert found is not None
    by_part, whole = found
    _check(whole, values)
    _check(by_part[:20_000], values[:20_000])
    _check(by_part[20_000:], values[20_000:])
