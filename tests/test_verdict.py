"""The verdict line's text: two epochs of different settings (marked as not an A/B; epochs of
identical settings never), an A/B's progress and
result, and copy bandwidth as a share of the PCIe peak."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from test_overlap_live import coll_cols, copy_cols

from tui.experiment.ab_experiment import Progress
from tui.experiment.ab_stats import Block, analyse
from tui.experiment.verdict import LinkPeak, pcie_peak, verdict_text
from tui.model.epochs import compare_epochs
from tui.model.overlap_live import RankOverlap
from workers.wire.settings import Settings


def test_adjacent_epochs_compare_copies_against_the_epoch_without() -> None:
    ov = RankOverlap()
    # epoch 0, mode overlap (1): 40 collectives of 120 us, the first 20 during a copy
    cc = coll_cols([0] * 40, [i * 200_000 for i in range(40)], dur_us=120.0, epoch=0)
    cc["mode"][:] = 1
    ov.add_coll(cc)
    ov.add_copy(copy_cols([0], [0], 4000.0) | {"epoch": np.zeros(1, dtype=np.int32)})
    # epoch 1, mode none (0): 40 collectives of 100 us
    cn = coll_cols([1] * 40, [10_000_000 + i * 200_000 for i in range(40)], dur_us=100.0, epoch=1)
    cn["mode"][:] = 0
    ov.add_coll(cn)
    ov.flush()
    c = compare_epochs([ov], [])
    assert c is not None and (c.base_mode, c.other_mode) == ("none", "overlap")  # none is the baseline
    text = verdict_text(None, c)
    assert text.startswith("overlap vs none: p50 +20.0 % · during copies +20.0 % · after +20.0 %")
    assert "not an A/B, no interval" in text


def epochs_of(*specs: tuple[int, int, float]) -> RankOverlap:
    """One rank's collectives: 40 of ``dur_us`` per (epoch, mode index, dur_us)."""
    ov = RankOverlap()
    for i, (epoch, mode, dur_us) in enumerate(specs):
        cc = coll_cols([epoch] * 40, [i * 10_000_000 + k * 200_000 for k in range(40)], dur_us=dur_us, epoch=epoch)
        cc["mode"][:] = mode
        ov.add_coll(cc)
    ov.flush()
    return ov


def test_epochs_of_identical_settings_are_never_compared() -> None:
    """A change that changed nothing (an unmodified job asked for copies) or an A/B's closing
    block: the newest epoch is compared with the newest one of other settings, or not at all."""
    same = {0: Settings(mode="none", copies=0), 1: Settings(mode="none", copies=0)}
    assert compare_epochs([epochs_of((0, 0, 100.0), (1, 0, 80.0))], [], same.get) is None
    assert compare_epochs([epochs_of((0, 0, 100.0), (1, 0, 80.0))], []) is None  # settings unknown, same mode
    sync = Settings(mode="sync")
    three = {0: Settings(mode="none"), 1: sync, 2: sync}
    c = compare_epochs([epochs_of((0, 0, 100.0), (1, 2, 150.0), (2, 2, 120.0))], [], three.get)
    assert c is not None and (c.base_epoch, c.other_epoch) == (0, 2)
    assert verdict_text(None, c).startswith("sync vs none: p50 +20.0 %")


def test_epochs_of_one_mode_name_what_else_differs() -> None:
    settings = {0: Settings(mode="overlap", copies=5), 1: Settings(mode="overlap", copies=3)}
    c = compare_epochs([epochs_of((0, 1, 100.0), (1, 1, 90.0))], [], settings.get)
    assert c is not None and c.change == "copies 5 → 3"
    text = verdict_text(None, c)
    assert text.startswith("copies 5 → 3 (overlap): p50 -10.0 %") and "(epochs 0, 1: not an A/B" in text


def test_ab_progress_and_result_lines() -> None:
    blocks = [Block(1, "A", 0), Block(2, "B", 0), Block(3, "B", 1), Block(4, "A", 1)]
    coll = {
        "epoch": np.repeat([1, 2, 3, 4], 10),
        "dur_us": np.repeat([100.0, 110.0, 111.0, 101.0], 10),
        "cls": np.repeat(np.array([0, 1, 1, 0], dtype=np.uint8), 10),
    }
    copy = {"epoch": np.array([2, 3]), "nbytes": np.array([55_000_000, 55_000_000]), "dur_us": np.array([1e3, 1e3])}
    res = analyse(blocks, coll, copy, a="mode=none", b="mode=overlap")
    peak = LinkPeak(63.0, "PCIe Gen5 x16")
    running = Progress("running", 2, 4, 5.0, 30.0, "", res)
    assert verdict_text(running, None, peak).startswith("A/B running: 4 blocks, 2 pairs, 5/30 s · so far mode=overlap")
    done = verdict_text(Progress("done", 2, 4, 9.0, 30.0, "", res), None, peak)
    assert done.startswith("A/B mode=overlap vs mode=none: p50 +10.0 % [+9.3, +10.6] · during copies +10.0 %")
    assert "copies 55.0 GB/s = 87 % of PCIe Gen5 x16 (theoretical 63.0 GB/s)" in done
    assert verdict_text(Progress("failed", 0, 1, 1.0, 30.0, "no records", None), None).startswith("A/B failed")


def test_pcie_peak_from_telemetry_rows() -> None:
    @dataclass
    class Row:  # the fields of tui.model.telemetry.GpuRow that are read
        pcie_peak_gbps: float
        pcie_gen: int
        pcie_width: int

    @dataclass
    class Tele:
        gpus: tuple[Row, ...]

    assert pcie_peak(None) is None
    assert pcie_peak(Tele((Row(float("nan"), -1, -1),))) is None
    peak = pcie_peak(Tele((Row(63.0, 5, 16),)))
    assert peak == LinkPeak(63.0, "PCIe Gen5 x16") and peak.share(float("nan")) == ""
