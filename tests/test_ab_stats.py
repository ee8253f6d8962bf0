"""A/B statistics alone, on generated data (a fake experiment, named as such): coverage of the
interval, detection of a real effect, classes compared with the right baseline."""

from __future__ import annotations

import math

import numpy as np

from tui.experiment.ab_stats import ALL, Block, analyse, format_table, paired_ratio, pct, t975
from workers.wire.overlap import AFTER, DURING, NO_COPIES


def test_t_quantiles() -> None:
    assert t975(1) == 12.706 and t975(30) == 2.042
    assert abs(t975(60) - 2.0003) < 2e-3 and abs(t975(120) - 1.9799) < 1e-3
    assert math.isnan(t975(0))


def fake_experiment(rng: np.random.Generator, pairs: int, effect: float, per_block: int = 200, drift: float = 0.2):
    """Blocks in random AB/BA order; durations lognormal around 100 us, a linear drift of
    ``drift`` over the run, a per-block random offset, and B scaled by ``effect``."""
    blocks, epochs, durs, classes = [], [], [], []
    epoch = 1
    for p in range(pairs):
        for arm in "AB" if rng.random() < 0.5 else "BA":
            blocks.append(Block(epoch, arm, p))
            t = epoch / (2 * pairs)
            level = 100.0 * (1 + drift * t) * math.exp(rng.normal(0, 0.01)) * (effect if arm == "B" else 1.0)
            durs.append(level * np.exp(rng.normal(0, 0.05, per_block)))
            epochs.append(np.full(per_block, epoch))
            classes.append(np.full(per_block, DURING if arm == "B" else NO_COPIES, dtype=np.uint8))
            epoch += 1
    coll = {"epoch": np.concatenate(epochs), "dur_us": np.concatenate(durs), "cls": np.concatenate(classes)}
    return blocks, coll


def test_identical_arms_interval_covers_one_about_95_percent() -> None:
    rng = np.random.default_rng(2026)
    runs = 400
    covered = 0
    for _ in range(runs):
        blocks, coll = fake_experiment(rng, pairs=8, effect=1.0)
        covered += not analyse(blocks, coll).overall.p50.detectable
    assert 0.92 * runs <= covered <= 0.98 * runs


def test_a_real_effect_is_detected_and_estimated() -> None:
    rng = np.random.default_rng(7)
    blocks, coll = fake_experiment(rng, pairs=10, effect=1.05)
    res = analyse(blocks, coll, a="mode=none", b="mode=overlap")
    r = res.overall.p50
    assert r.detectable and r.lo < 1.05 < r.hi and abs(r.estimate - 1.05) < 0.01
    assert res.overall.mean.detectable
    # B's collectives are all "during copies"; A has none of them: compared with all of A
    during = res.rows["during copies"]
    assert during.baseline == ALL and during.b.n == 10 * 200 and during.a.n == 10 * 200
    assert "no detectable difference" not in res.verdict()
    assert abs(during.p50.estimate - 1.05) < 0.01
    assert f"during copies {pct(during.p50.estimate)} %" in res.verdict()
    text = format_table(res)
    assert "A/B: A = mode=none, B = mode=overlap" in text and "during copies" in text


def test_records_outside_blocks_and_unpaired_blocks_are_ignored() -> None:
    blocks = [Block(3, "A", 0), Block(4, "B", 0), Block(5, "A", 1)]  # pair 1 never got its B block
    coll = {
        "epoch": np.array([1, 1, 3, 3, 4, 4, 5]),
        "dur_us": np.array([1e6, 1e6, 100, 100, 110, 110, 5.0]),
        "cls": np.array([NO_COPIES, NO_COPIES, NO_COPIES, AFTER, NO_COPIES, AFTER, NO_COPIES], dtype=np.uint8),
    }
    res = analyse(blocks, coll)
    assert res.pairs == 1 and res.blocks == 3
    assert res.overall.a.n == 3 and res.overall.b.n == 2  # epoch 1 (warm-up) is no block
    assert math.isclose(res.overall.p50.estimate, 1.1) and not res.overall.p50.known  # one pair: no interval
    assert res.rows["after copies"].baseline == "after copies"


def test_paired_ratio_by_hand() -> None:
    r = paired_ratio(np.array([1.0, 1.0, 1.0]), np.array([1.1, 1.2, 1.3]))
    logs = np.log([1.1, 1.2, 1.3])
    half = 4.303 * logs.std(ddof=1) / math.sqrt(3)
    assert math.isclose(r.estimate, math.exp(logs.mean()))
    assert math.isclose(r.lo, math.exp(logs.mean() - half)) and math.isclose(r.hi, math.exp(logs.mean() + half))
    assert r.words() == "+19.7 % [-2.7, +47.3] no detectable difference"


def test_hbm_utilisation_per_arm_in_table_json_and_verdict() -> None:
    """GPM HBM bandwidth per arm says which arm used HBM more; without GPM nothing is said. (Not
    in the one-line verdict: `commtop report` must reproduce that line exactly.)"""
    from tui.experiment.ab_stats import as_json

    rng = np.random.default_rng(3)
    blocks, coll = fake_experiment(rng, pairs=4, effect=1.05)
    res = analyse(blocks, coll, a="mode=none", b="mode=overlap", hbm_util_pct=(12.4, 31.0))
    assert "HBM bandwidth used (GPM DRAM_BW_UTIL): A 12.4 %, B 31.0 % · busier in B (+18.6 points)" in format_table(res)
    assert "busier in A" in format_table(analyse(blocks, coll, hbm_util_pct=(80.0, 20.0)))
    assert as_json(res)["hbm_util_pct"] == [12.4, 31.0]
    plain = analyse(blocks, coll, a="mode=none", b="mode=overlap")
    assert "HBM" not in plain.verdict() and "HBM" not in format_table(plain)
