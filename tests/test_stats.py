"""Ring buffers, run-wide aggregates and axis scaling against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tui.model.stats import (
    AxisScale,
    LogHistogram,
    Ring,
    RunAggregate,
    RunStats,
    nice_ceiling,
    pooled_stats,
    weighted_rate,
)
from workers.wire.stats import median, percentile, percentiles, percentiles_and_max


def test_ring_keeps_the_newest_rows_in_order_across_the_wrap() -> None:
    ring = Ring({"a": "<i8", "b": "<f4"}, size=5)
    ring.append({"a": np.array([1, 2, 3]), "b": np.array([0.5, 1.5, 2.5])})
    assert ring.view()["a"].tolist() == [1, 2, 3]
    ring.append({"a": np.array([4, 5, 6, 7]), "b": np.zeros(4)})
    assert ring.view()["a"].tolist() == [3, 4, 5, 6, 7]
    assert ring.view(2)["a"].tolist() == [6, 7]
    assert (len(ring), ring.total) == (5, 7)
    ring.append({"a": np.arange(100, 112), "b": np.zeros(12)})  # larger than the ring
    assert ring.view()["a"].tolist() == [107, 108, 109, 110, 111]


def test_ring_holds_the_newest_rows_for_any_sequence_of_batch_sizes() -> None:
    rng = np.random.default_rng(2)
    for size in (1, 5, 64):
        ring, every = Ring({"a": "<i8", "b": "<f4"}, size=size), np.zeros(0, dtype=np.int64)
        for _ in range(200):
            n = int(rng.choice([0, 1, size - 1, size, size + 1, int(rng.integers(0, 3 * size + 2))]))
            a = np.arange(len(every), len(every) + max(n, 0), dtype=np.int64)
            ring.append({"a": a, "b": a.astype(np.float32) / 2})
            every = np.concatenate((every, a))
            got = ring.view()
            assert got["a"].tolist() == every[-size:].tolist() and (got["b"] == got["a"] / 2).all()
            assert (len(ring), ring.total) == (min(size, len(every)), len(every))


def test_ring_view_is_a_copy() -> None:
    ring = Ring({"a": "<i8"}, size=4)
    ring.append({"a": np.array([1, 2])})
    got = ring.view()["a"]
    ring.append({"a": np.array([9, 9, 9, 9])})
    assert got.tolist() == [1, 2]


def test_ring_window_is_the_rows_near_the_newest_time_in_order_or_not() -> None:
    rng = np.random.default_rng(5)
    for size in (1, 7, 64):
        ring, t_all = Ring({"t": "<i8", "v": "<f4", "w": "<u1"}, size=size), np.zeros(0, dtype=np.int64)
        for step in range(120):
            n = int(rng.integers(0, 2 * size + 2))
            t = np.arange(len(t_all), len(t_all) + n, dtype=np.int64) * 10
            if step % 7 == 3 and n > 1:  # now and then a batch out of time order
                t = t[::-1].copy()
            ring.append({"t": t, "v": t.astype(np.float32) / 2, "w": (t % 256).astype(np.uint8)})
            t_all = np.concatenate((t_all, t))
            held = t_all[-size:]
            for span in (0, 25, 10 * size, 10**9):
                got = ring.window("t", span, ("t", "v"))
                want = held[held >= held.max() - span] if len(held) else held
                assert set(got) == {"t", "v"}
                assert got["t"].tolist() == want.tolist() and (got["v"] == got["t"] / 2).all()
    assert Ring({"t": "<i8"}, size=4).window("t", 5, ("t",))["t"].tolist() == []


def test_percentile_is_numpys_linear_definition_bit_for_bit() -> None:
    values = np.array([4.0, 1.0, 3.0, 2.0])
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert math.isnan(percentile(np.array([]), 50))
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 100, 4099):
        d32 = rng.lognormal(4.0, 1.0, n).astype(np.float32)
        qs = [0, 1, 50, 90, 99, 99.9, 100]
        got, top = percentiles_and_max(d32, qs)
        assert got == np.percentile(d32.astype(np.float64), qs).tolist()
        assert top == float(d32.max()) and max(got) <= top
    with_zero = np.array([0.0, -0.0, 1.0], dtype=np.float32)
    assert percentiles(with_zero, [50]) == np.percentile(with_zero.astype(np.float64), [50]).tolist()


def test_median_is_numpys_bit_for_bit_signed_zeros_and_nan_included() -> None:
    rng = np.random.default_rng(7)
    cases: list[np.ndarray] = []
    for trial in range(600):
        n = int(rng.integers(1, 5 if trial % 3 == 0 else 400))
        values = (rng.lognormal(0, 3, n) * rng.choice([1, -1], n)).astype([np.float32, np.float64][trial % 2])
        if trial % 5 == 0:
            values[rng.integers(0, n)] = 0.0
        if trial % 7 == 0:
            values[: max(1, n // 2)] = -0.0
        cases.append(values)
    cases.append(np.array([1.0, np.nan, 2.0], dtype=np.float32))
    for values in cases:
        for given in (values, values.astype(np.float64).tolist()):
            want, got = float(np.median(given)), median(given)
            assert (want == got and math.copysign(1, want) == math.copysign(1, got)) or (
                math.isnan(want) and math.isnan(got)
            ), (want, got, given)
    assert math.isnan(median([]))
    assert median(np.array([1, 2, 3, 4])) == 2.5  # integers: numpy's own path


def test_run_aggregate_percentiles_equal_the_reports_while_exact_and_never_exceed_max_after() -> None:
    rng = np.random.default_rng(5)
    values = rng.lognormal(7.0, 0.5, RunAggregate.EXACT_CAP).astype(np.float32)
    agg = RunAggregate()
    for part in np.array_split(values, 9):
        agg.add(part)
    st = agg.stats()
    assert st.exact
    want = np.percentile(values.astype(np.float64), [50, 99]) / 1e3
    assert (st.p50_ms, st.p99_ms) == (want[0], want[1])
    agg.add(np.array([1.0]))  # one past the cap: histogram, clamped to the exact min and max
    st = agg.stats()
    assert not st.exact and st.min_ms <= st.p50_ms <= st.p99_ms <= st.max_ms


def test_run_aggregate_read_between_adds_and_merges_equals_every_value_sorted_again() -> None:
    """Whole-run numbers are read between adds (the kept sorted run merged with what came
    since); each read must equal numpy's percentiles of all values so far, NaN and merges included."""
    rng = np.random.default_rng(11)
    for trial in range(60):
        agg, other, seen = RunAggregate(), RunAggregate(), []
        read = float(rng.uniform(0.02, 0.5))  # some trials read rarely: many parts between reads
        for _ in range(int(rng.integers(1, 150))):
            n = int(rng.integers(1, 200))
            part = rng.lognormal(5.0, 1.0, n).astype(np.float32)
            if rng.random() < 0.1:
                part[int(rng.integers(0, n))] = np.nan
            if rng.random() < 0.2:  # into another aggregate, merged in
                other.add(part)
                if rng.random() < 0.5:
                    other.stats()
                agg.merge(other)
                other = RunAggregate()
            else:
                agg.add(part)
            seen.append(part)
            if rng.random() < read and agg.count <= RunAggregate.EXACT_CAP:
                st = agg.stats()
                every = np.concatenate(seen).astype(np.float64)
                want = np.percentile(every, [50, 99]) / 1e3
                assert st.exact and st.count == len(every), trial
                assert np.array_equal([st.p50_ms, st.p99_ms], want, equal_nan=True), (trial, st, want)


def test_pooled_stats_of_one_aggregate_with_records_are_its_own_and_of_several_their_merge() -> None:
    rng = np.random.default_rng(3)
    one, empty = RunAggregate(), RunAggregate()
    one.add(rng.lognormal(5.0, 1.0, 500).astype(np.float32), rng.random(500))
    merged = RunAggregate()
    merged.merge(one)
    assert pooled_stats([empty, one, RunAggregate()]) == merged.stats() == one.stats()
    two = RunAggregate()
    two.add(rng.lognormal(6.0, 1.0, 300).astype(np.float32))
    both = RunAggregate()
    both.merge(one)
    both.merge(two)
    assert pooled_stats([one, two]) == both.stats() and both.stats().count == 800
    assert pooled_stats([]) == RunStats()


def test_weighted_rate_is_the_rate_at_the_average_duration() -> None:
    # 10 GB/s for 1 us and 1 GB/s for 9 us: 10*1 + 1*9 = 19 over 10 us = 1.9
    assert weighted_rate(np.array([10.0, 1.0]), np.array([1.0, 9.0])) == pytest.approx(1.9)


def test_log_histogram_percentiles_are_within_its_documented_resolution() -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=8.0, sigma=1.0, size=50_000)
    hist = LogHistogram()
    for chunk in np.array_split(values, 7):
        hist.add(chunk)
    assert hist.count == len(values)
    for q in (0.5, 0.9, 0.99):
        exact = float(np.percentile(values, q * 100, method="inverted_cdf"))
        assert hist.quantile(q) == pytest.approx(exact, rel=0.0116)


def test_log_histogram_clamps_out_of_range_values_and_ignores_nan() -> None:
    hist = LogHistogram()
    hist.add(np.array([0.0, -5.0, np.nan, 1e12]))
    assert hist.count == 4
    assert hist.counts[0] == 3 and hist.counts[-1] == 1


def test_run_aggregate_keeps_count_sum_min_max_and_busbw_at_average_time() -> None:
    agg = RunAggregate()
    agg.add(np.array([1000.0, 3000.0]), np.array([4.0, 2.0]))
    agg.add(np.array([2000.0]), np.array([1.0]))
    st = agg.stats()
    assert st.count == 3
    assert st.mean_ms == pytest.approx(2.0)
    assert (st.min_ms, st.max_ms) == (1.0, 3.0)
    assert st.busbw_gbps == pytest.approx((4 * 1000 + 2 * 3000 + 1 * 2000) / 6000)
    assert st.p50_ms == pytest.approx(2.0, rel=0.012)
    assert math.isnan(RunAggregate().stats().p50_ms)


def test_nice_ceiling() -> None:
    assert nice_ceiling(2.7) == 3.0
    assert nice_ceiling(13.0) == 15.0
    assert nice_ceiling(0.11) == pytest.approx(0.15)
    assert nice_ceiling(8.5) == 10.0
    assert nice_ceiling(0.0) == 1.0


def test_axis_rescales_at_most_once_a_second() -> None:
    axis = AxisScale(min_interval_s=1.0, headroom=1.0)
    assert axis.update(2.7, now_s=0.0) == 3.0
    assert axis.update(13.0, now_s=0.5) == 3.0  # too soon: keep the top, the widget clips
    assert axis.update(13.0, now_s=1.0) == 15.0
    assert axis.update(2.0, now_s=1.5) == 15.0
    assert axis.update(2.0, now_s=2.1) == 2.0
