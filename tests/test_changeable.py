"""What a run can change (tui.model.changeable): the one decision behind `ctl`, the keys and
`ab`, for commtop's loop, a monitored job with knobs, a job without any, and live control off."""

from __future__ import annotations

import pytest

from tui.model.changeable import KNOBS, LOOP, NOTHING, UNKNOWN, Changeable, job_refusal
from workers.wire.settings import Settings, SettingsError

OFFLOAD = {"offload": ["none", "overlap", "sync"]}


def monitored(knobs: dict[str, list[str]], **extra: object) -> Changeable:
    config = {"source": "monitor", "collective": "monitor: train_ddp.py", "knobs": knobs} | extra
    return Changeable.from_hello(config, 2)


def test_the_loop_takes_its_settings_and_no_knobs() -> None:
    can = Changeable.from_hello({"collective": "all_gather", "shape": [1024]}, 2)
    assert can.kind == LOOP and can.known and "delay_rank" in can.names()
    assert can.check({"mode": "sync", "copies": 3, "delay_ms": 110, "delay_rank": 1, "delay_on": "gpu"}) == ""
    assert can.check({"delay_rank": -1}) == ""  # every rank, r/(n-1) of the delay
    assert can.check({"knob.offload": "sync"}).startswith("knob.offload: commtop's own loop has no knobs")
    assert can.check({"speed": 1}).startswith("unknown setting 'speed'")
    assert "mode must be one of none, overlap, sync, sync-barrier" in can.check({"mode": "fast"})


def test_delay_rank_beyond_the_world_is_refused() -> None:
    can = Changeable.loop(2)
    assert (
        can.check({"delay_ms": 110, "delay_rank": 3})
        == "delay_rank=3: this run has 2 ranks (0..1, or -1 for every rank)"
    )
    assert can.check({"delay_rank": 1}) == ""
    assert Changeable.loop(0).check({"delay_rank": 3}) == ""  # world not known yet: the loop clamps nothing


def test_a_monitored_job_takes_only_its_knobs_and_their_choices() -> None:
    can = monitored(OFFLOAD, mode_knob="offload")
    assert can.kind == KNOBS and can.names() == ("mode", "knob.offload") and can.modes() == ("none", "overlap", "sync")
    assert can.check({"knob.offload": "sync"}) == "" and can.check({"offload": "none"}) == ""
    assert can.check({"knob.offload": "off"}) == "knob.offload=off: choices none, overlap, sync"
    assert (
        can.check({"mode": "sync-barrier"})
        == "mode=sync-barrier: train_ddp.py's offload knob takes none, overlap, sync"
    )
    knobs = "(its knobs: offload (none/overlap/sync))"
    assert can.check({"copies": 3}) == f"train_ddp.py has no knob for copies {knobs}"
    assert can.check({"delay_ms": 20}) == f"train_ddp.py has no knob for a straggler delay {knobs}"
    assert can.check({"knob.colour": "red"}) == f"train_ddp.py has no knob 'colour' {knobs}"
    # the first refused change names the reason; nothing is half-applied
    assert can.check({"knob.offload": "sync", "pinned": False}).startswith("train_ddp.py has no knob for pinned")


def test_the_mode_knob_and_mode_move_together() -> None:
    can = monitored(OFFLOAD, mode_knob="offload")
    now = Settings(mode="overlap", copies=0, knobs={"offload": "overlap"})
    assert can.updated(now, {"mode": "sync"}) == Settings(mode="sync", copies=0, knobs={"offload": "sync"})
    assert can.updated(now, {"knob.offload": "none"}) == Settings(mode="none", copies=0, knobs={"offload": "none"})
    with pytest.raises(SettingsError, match="choices none, overlap, sync"):
        can.updated(now, {"knob.offload": "on"})


def test_a_job_without_a_mode_knob_refuses_mode() -> None:
    can = monitored({"lr": ["1e-3", "1e-4"]})
    assert can.modes() == () and can.names() == ("knob.lr",)
    assert can.check({"mode": "sync"}) == "train_ddp.py has no offload-mode knob (its knobs: lr (1e-3/1e-4))"


def test_a_job_without_knobs_refuses_everything_and_says_so() -> None:
    can = Changeable.from_hello({"source": "monitor", "collective": "monitor: train_ddp_plain.py", "knobs": {}}, 2)
    assert can.kind == NOTHING and can.known and can.names() == () and can.describe() == "nothing (no knobs)"
    for change in ({"mode": "sync"}, {"copies": 3}, {"knob.offload": "sync"}):
        assert can.check(change).startswith("train_ddp_plain.py has no live knobs (an unmodified script")
    # before its first step a job may still declare knobs: not final yet
    early = Changeable.from_hello({"source": "monitor", "knobs": {}, "knobs_final": False}, 2)
    assert not early.known and "has declared no knobs yet" in early.check({"mode": "sync"})


def test_live_control_off_refuses_at_once() -> None:
    for can in (Changeable.from_hello({"live_control": False}, 2), monitored(OFFLOAD, live_control=False)):
        assert can.check({"mode": "sync"}).startswith("live control is off in this run (COMMTOP_LIVE_CONTROL=0")
        assert can.names() == () and can.describe() == "nothing (live control is off)"


def test_before_any_hello_nothing_is_known() -> None:
    can = Changeable()
    assert can.kind == UNKNOWN and not can.known
    assert can.check({"mode": "sync"}) == "the workers have not reported their settings yet; try again in a moment"


def test_it_travels_in_ctl_status_unchanged() -> None:
    for can in (
        Changeable.loop(4),
        monitored(OFFLOAD, mode_knob="offload"),
        Changeable.from_hello({"live_control": False}, 2),
    ):
        assert Changeable.from_wire(can.wire()) == can
    assert Changeable.from_wire(None) == Changeable()  # an older collector: not known
    assert Changeable.from_wire({"kind": "loop", "world_size": "x", "knobs": [1]}) == Changeable(LOOP)


def test_before_a_jobs_hello_only_the_loops_own_settings_are_refused() -> None:
    assert job_refusal({"knob.offload": "on", "mode": "sync"}) == ""  # its knobs are known once it runs
    assert job_refusal({"copies": 3}).startswith("a job has no knob for copies (that is commtop's own loop")
    assert job_refusal({"mode": "fast"}).startswith("mode must be one of none, overlap, sync, sync-barrier")
