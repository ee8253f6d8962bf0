"""The A/B schedule alone: a fake controller (numbers epochs, no workers) and a hand-driven
clock, with record batches made here: pairs in random AB/BA order, marks, the restore at the
end, --until-ci, and link throughput per arm."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tui.experiment.ab_experiment import ABExperiment, arm_hbm, arm_link
from tui.experiment.ab_stats import AB_MARK, WARMUP, Block, blocks_from_marks
from tui.ingest.interfaces import ControlView
from tui.model.changeable import Changeable
from workers.wire.protocol import COLL, COLL_COLUMNS, Batch
from workers.wire.settings import Settings


class FakeController:
    """Test-only: accepts every change and numbers the epochs like the control server."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.epoch = 7

    def request(self, changes: dict[str, Any], new_epoch: bool = False) -> str:
        self.requests.append(dict(changes))
        self.epoch += 1
        return ""

    @property
    def desired(self) -> tuple[int, Any]:
        return (self.epoch, None)

    def view(self) -> ControlView:
        return ControlView(requested=Settings(mode="overlap", copies=5), can_change=Changeable.loop(2))


def batch(epoch: int, n: int, dur_us: float, t0: int) -> Batch:
    cols = {name: np.zeros(n, dtype=dt) for name, dt in COLL_COLUMNS.items()}
    cols["epoch"][:] = epoch
    cols["step"][:] = np.arange(n) // 4
    cols["start_ns"][:] = t0 + np.arange(n) * 1_000_000
    cols["dur_us"][:] = dur_us * np.exp(np.random.default_rng(epoch).normal(0, 0.01, n))
    return Batch(COLL, 0, 0, 0, cols)


def drive(exp: ABExperiment, ctl: FakeController, effect: float, max_ticks: int = 400) -> None:
    """Tick the experiment; after each new block, deliver that epoch's records (B slower)."""
    now = [0.0]
    exp.clock = lambda: now[0]
    delivered: set[int] = set()
    for _ in range(max_ticks):
        if exp.tick():
            return
        for blk in exp.blocks:
            if blk.epoch not in delivered:
                delivered.add(blk.epoch)
                exp.write(batch(blk.epoch, 200, 100.0 * (effect if blk.arm == "B" else 1.0), int(now[0] * 1e9)))
        now[0] += 0.25
    raise AssertionError("the experiment never ended")


def test_pairs_in_random_order_marks_and_restore() -> None:
    ctl = FakeController()
    marks: list[dict[str, Any]] = []
    exp = ABExperiment(
        ctl, {"mode": "none"}, {"mode": "overlap"}, duration_s=10, block_s=1.0, seed=3, mark=marks.append
    )
    drive(exp, ctl, effect=1.1)
    assert exp.state == "done"
    warm, *scored, cool = exp.blocks
    # an unscored warm-up block first, in the settings of pair 0's first block, and an unscored
    # one after the last scored block, in its settings, before the restore
    assert warm.arm == WARMUP and warm.pair == -1 and ctl.requests[0] == ctl.requests[1]
    assert cool.arm == WARMUP and cool.pair == -1 and ctl.requests[-2] == ctl.requests[-3]
    pairs: dict[int, list[str]] = {}
    for blk in scored:
        pairs.setdefault(blk.pair, []).append(blk.arm)
    orders = {"".join(arms) for arms in pairs.values()}
    assert all(sorted(arms) == ["A", "B"] for arms in pairs.values())
    assert orders == {"AB", "BA"}  # both orders occur (seeded)
    assert ctl.requests[-1] == {"mode": "overlap"}  # the settings from before are back
    assert [m["event"] for m in marks][0] == "start" and marks[-1]["event"] == "end"
    assert all(m["k"] == AB_MARK for m in marks)
    ((start, blocks),) = blocks_from_marks([(0, m) for m in marks])
    assert blocks == scored and start["a"] == "mode=none" and start["b"] == "mode=overlap"
    assert start["seconds"] == (marks[-1]["t_ns"] - marks[0]["t_ns"]) / 1e9 > 0  # start to end: the report's seconds
    res = exp.result()
    assert res.pairs == len(pairs) and res.overall.p50.detectable
    assert abs(res.overall.p50.estimate - 1.1) < 0.01


def test_until_ci_stops_once_the_interval_is_narrow() -> None:
    ctl = FakeController()
    exp = ABExperiment(ctl, {"mode": "none"}, {"mode": "sync"}, duration_s=1000, until_ci_pct=1.0, block_s=0.5, seed=1)
    drive(exp, ctl, effect=1.05)
    res = exp.result()
    assert exp.state == "done" and res.pairs < 20  # long before 1000 s
    assert res.overall.p50.half_width_pct <= 1.0


def test_link_throughput_is_averaged_over_each_arms_blocks() -> None:
    blocks = [Block(1, "A", 0), Block(2, "B", 0)]
    windows = {1: (0, 10), 2: (20, 30)}
    nan = float("nan")
    ticks = [(5, 1.0, nan, nan), (8, 3.0, nan, nan), (25, 50.0, nan, nan), (40, 99.0, nan, nan)]
    assert arm_link(blocks, windows, ticks) == (2.0, 50.0)
    with_nvlink = [(5, 1.0, 100.0, nan), (25, 2.0, 0.0, nan)]
    assert arm_link(blocks, windows, with_nvlink) == (101.0, 2.0)  # NVLink adds where it carries traffic
    # HBM utilisation (GPM) the same way; NaN (no GPM on this machine) for both arms without it
    assert all(math.isnan(x) for x in arm_hbm(blocks, windows, ticks))
    with_hbm = [(5, 1.0, nan, 10.0), (8, 1.0, nan, 20.0), (25, 50.0, nan, 60.0), (28, 50.0, nan, nan)]
    assert arm_hbm(blocks, windows, with_hbm) == (15.0, 60.0)


def test_a_batch_across_a_switch_gives_each_block_its_own_time_window() -> None:
    """A batch that holds the end of one block and the start of the next must not stretch either
    block's window over the other's (link and HBM telemetry are averaged over these windows, as
    `commtop report` does from the recording's records)."""
    ctl = FakeController()
    exp = ABExperiment(ctl, {"mode": "none"}, {"mode": "overlap"}, seed=1)
    exp.clock = lambda: 0.0
    exp.tick()
    exp.tick()  # (in the test clock no time passes: force the second block of the pair)
    exp._next_block(0.0)
    first, second = exp.blocks[0].epoch, exp.blocks[1].epoch
    b = batch(first, 8, 100.0, 1_000_000_000)
    b.columns["epoch"][4:] = second  # records 4..7 (starting 4..7 ms later) ran as the next block
    exp.write(b)
    assert exp._windows[first] == (1_000_000_000, 1_003_000_000)
    assert exp._windows[second] == (1_004_000_000, 1_007_000_000)


class KnobJob(FakeController):
    """Test-only: a monitored job with an ``offload`` knob (its mode knob) in force at overlap."""

    can = Changeable.from_hello(
        {"source": "monitor", "collective": "monitor: train_ddp.py", "knobs": {"offload": ["none", "overlap", "sync"]},
         "mode_knob": "offload"},
        2,
    )  # fmt: skip

    def view(self) -> ControlView:
        return ControlView(Settings(mode="overlap", copies=0, knobs={"offload": "overlap"}), can_change=self.can)


def test_an_arm_the_run_cannot_set_fails_at_once_and_changes_nothing() -> None:
    ctl = KnobJob()
    exp = ABExperiment(ctl, {"knob.offload": "off"}, {"knob.offload": "on"}, seed=1)
    assert exp.tick() and exp.state == "failed" and ctl.requests == []
    assert exp.refused == "arm A (knob.offload=off): knob.offload=off: choices none, overlap, sync"


def test_a_knob_is_restored_to_its_value_before_also_by_its_bare_name() -> None:
    ctl = KnobJob()
    exp = ABExperiment(ctl, {"knob.offload": "none"}, {"offload": "sync"}, duration_s=3, block_s=0.5, seed=2)
    drive(exp, ctl, effect=1.1)
    assert exp.state == "done" and exp.restore == {"knob.offload": "overlap", "offload": "overlap"}
    assert ctl.requests[-1] == {"knob.offload": "overlap", "offload": "overlap"}


class Refusing(FakeController):
    """Test-only: the first block is refused (the run changed under the experiment)."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error

    def request(self, changes: dict[str, Any], new_epoch: bool = False) -> str:
        self.requests.append(dict(changes))
        return self.error

    def view(self) -> ControlView:
        return ControlView(Settings(mode="overlap", copies=5), can_change=Changeable.loop(2))


def test_a_refused_block_ends_the_experiment_instead_of_retrying_for_ever() -> None:
    ctl = Refusing("offload must be one of none, overlap, sync; got 'off'")
    exp = ABExperiment(ctl, {"mode": "none"}, {"mode": "sync"}, seed=1)
    exp.clock = lambda: 0.0
    assert exp.tick() and exp.state == "failed" and "got 'off'" in exp.note


def test_a_busy_run_is_retried_but_not_for_ever() -> None:
    ctl = Refusing("the workers are still switching to an earlier change; try again in a moment")
    now = [0.0]
    exp = ABExperiment(ctl, {"mode": "none"}, {"mode": "sync"}, seed=1, clock=lambda: now[0])
    assert not exp.tick() and exp.state == "switching"
    now[0] = 10.0
    assert not exp.tick()
    now[0] = 31.0
    assert exp.tick() and exp.state == "failed" and "still switching" in exp.note


def test_until_ci_that_reaches_the_duration_says_the_target_was_missed() -> None:
    ctl = FakeController()
    exp = ABExperiment(ctl, {"mode": "none"}, {"mode": "sync"}, duration_s=4, until_ci_pct=0.01, block_s=0.5, seed=1)
    drive(exp, ctl, effect=1.05)
    assert exp.state == "done" and exp.note.startswith("target +/-0.01 % missed: the p50 interval reached +/-"), (
        exp.note
    )
    assert "in 4 s" in exp.note


class SlowJob(FakeController):
    """Test-only: a monitored job whose ranks report late (slow start-up), then declare their
    knobs a while later."""

    def __init__(self, reports_at: float, knobs_at: float) -> None:
        super().__init__()
        self.now = 0.0
        self.reports_at, self.knobs_at = reports_at, knobs_at

    def view(self) -> ControlView:
        if self.now < self.reports_at:
            return ControlView(requested=None, can_change=Changeable())
        config = {"source": "monitor", "collective": "monitor: train_ddp.py", "mode_knob": "offload"}
        if self.now < self.knobs_at:
            not_yet = Changeable.from_hello({**config, "knobs_final": False}, 2)
            return ControlView(requested=Settings(mode="none"), can_change=not_yet)
        return KnobJob().view()


def test_the_wait_for_knobs_counts_from_the_first_report_not_from_a_slow_start() -> None:
    """Ranks that take 100 s to start (a loaded machine) then 20 s to their first step: the
    experiment starts; the 30 s for knobs run from the first report."""
    ctl = SlowJob(reports_at=100.0, knobs_at=120.0)
    exp = ABExperiment(ctl, {"knob.offload": "none"}, {"knob.offload": "sync"}, seed=1, clock=lambda: ctl.now)
    for t in (0.0, 60.0, 100.0, 119.0):
        ctl.now = t
        assert not exp.tick() and exp.state == "starting", exp.note
    assert exp.note == "waiting for the job to declare its knobs"
    ctl.now = 121.0
    assert not exp.tick() and exp.state != "failed" and ctl.requests  # the first block was asked for


def test_workers_that_never_report_or_never_declare_knobs_end_the_experiment() -> None:
    never = SlowJob(reports_at=math.inf, knobs_at=math.inf)
    exp = ABExperiment(never, {"knob.offload": "none"}, {"knob.offload": "sync"}, seed=1, clock=lambda: never.now)
    for t in (0.0, 119.0):
        never.now = t
        assert not exp.tick()
    never.now = 121.0
    assert exp.tick() and exp.state == "failed" and exp.note == "the workers never reported their settings"
    mute = SlowJob(reports_at=10.0, knobs_at=math.inf)
    exp = ABExperiment(mute, {"knob.offload": "none"}, {"knob.offload": "sync"}, seed=1, clock=lambda: mute.now)
    for t in (0.0, 10.0, 40.0):
        mute.now = t
        assert not exp.tick()
    mute.now = 41.0
    assert exp.tick() and exp.state == "failed" and "has declared no knobs yet" in exp.note
