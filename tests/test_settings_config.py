"""Live settings allow-list and loop options: bad values get one clear line, nothing changes."""

from __future__ import annotations

import argparse

import pytest

from workers.wire.config import ConfigError, LoopConfig, add_loop_arguments, config_from_args, config_from_dict
from workers.wire.settings import (
    MAX_KNOB_TEXT,
    MAX_KNOBS,
    Settings,
    SettingsError,
    knob_name,
    parse_assignment,
    settings_from_wire,
)


def test_settings_accept_valid_changes() -> None:
    s = Settings().updated(
        {"mode": "sync-barrier", "copies": "3", "copy_scale": "0.25", "pinned": "false", "direction": "h2d"}
    )
    assert (s.mode, s.copies, s.copy_scale, s.pinned, s.direction) == ("sync-barrier", 3, 0.25, False, "h2d")


@pytest.mark.parametrize(
    "changes",
    [
        {"mode": "async"},
        {"copies": 17},
        {"copies": -1},
        {"copies": "many"},
        {"copies": 2.5},
        {"copy_scale": 3},
        {"pinned": "maybe"},
        {"direction": "d2d"},
        {"rm -rf": 1},
        {"knob.offload": "x"},
    ],
)
def test_settings_refuse_bad_changes(changes: dict) -> None:
    before = Settings()
    with pytest.raises(SettingsError) as info:
        before.updated(changes)
    assert "\n" not in str(info.value)
    assert before == Settings()


def test_user_knobs_are_validated_against_declared_choices() -> None:
    knobs = {"offload": ("none", "overlap")}
    assert Settings().updated({"offload": "none"}, knobs).knobs == {"offload": "none"}
    with pytest.raises(SettingsError):
        Settings().updated({"offload": "fast"}, knobs)


def test_knob_name_reads_knob_dot_x_and_declared_bare_names() -> None:
    knobs = {"offload": ("none", "overlap")}
    assert knob_name("knob.offload") == knob_name("knob.offload", knobs) == knob_name("offload", knobs) == "offload"
    assert knob_name("offload") is None and knob_name("dtype", knobs) is None


def test_parse_assignment() -> None:
    assert parse_assignment("copies=3") == ("copies", "3")
    with pytest.raises(SettingsError):
        parse_assignment("copies")


def _parse(*argv: str, cpu: bool = False) -> LoopConfig:
    parser = argparse.ArgumentParser()
    add_loop_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)), cpu=cpu)


def test_defaults_follow_the_forum_on_gpu_and_shrink_on_cpu() -> None:
    gpu = _parse()
    assert (gpu.collective, gpu.shape, gpu.dtype, gpu.copies, gpu.collectives_per_step) == (
        "all_gather",
        (8192, 8192),
        "bfloat16",
        5,
        32,
    )
    assert gpu.tensor_bytes == 128 * 2**20
    cpu = _parse(cpu=True)
    assert cpu.dtype == "float32" and cpu.tensor_bytes < gpu.tensor_bytes


@pytest.mark.parametrize(
    "argv",
    [
        ("--shape", "8192xx"),
        ("--shape", "0x5"),
        ("--copies", "40"),
        ("--copy-scale", "3"),
        ("--iters", "-1"),
        ("--shape", "999999x999999"),
    ],
)
def test_bad_options_raise_one_line(argv: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        _parse(*argv)
    assert "\n" not in str(info.value)


def test_config_round_trips_through_argv_and_dict() -> None:
    cfg = _parse("--collective", "all_reduce", "--shape", "64x32", "--offload", "sync", "--host-memory", "pageable")
    parser = argparse.ArgumentParser()
    add_loop_arguments(parser)
    assert config_from_args(parser.parse_args(cfg.to_argv()), cpu=False) == cfg
    assert config_from_dict(cfg.as_dict()) == cfg


def test_settings_from_wire_validates_like_a_change():
    assert settings_from_wire({"mode": "sync", "copies": 3, "other": 1}) == Settings(mode="sync", copies=3)
    with pytest.raises(SettingsError):
        settings_from_wire({"copies": 17})
    with pytest.raises(SettingsError):
        settings_from_wire(["mode"])


def test_settings_from_wire_checks_knobs_against_declared_choices_when_known():
    choices = {"offload": ("none", "sync")}
    assert settings_from_wire({"knobs": {"offload": "sync"}}, choices).knobs == {"offload": "sync"}
    with pytest.raises(SettingsError):
        settings_from_wire({"knobs": {"offload": "later"}}, choices)
    with pytest.raises(SettingsError):
        settings_from_wire({"knobs": {"unknown": "x"}}, choices)


def test_settings_from_wire_keeps_reported_knobs_within_bounds_when_choices_are_unknown():
    assert settings_from_wire({"mode": "none", "knobs": {"offload": "sync"}}).knobs == {"offload": "sync"}
    with pytest.raises(SettingsError):
        settings_from_wire({"knobs": {f"k{i}": "v" for i in range(MAX_KNOBS + 1)}})
    with pytest.raises(SettingsError):
        settings_from_wire({"knobs": {"k": "v" * (MAX_KNOB_TEXT + 1)}})
    with pytest.raises(SettingsError):
        settings_from_wire({"knobs": ["offload"]})


def test_batches_are_spaced_with_the_world_size_beyond_16_ranks() -> None:
    from workers.wire.config import MAX_SCALED_BATCH_MS, batch_ms_for_world

    assert batch_ms_for_world(50.0, 1) == batch_ms_for_world(50.0, 16) == 50.0
    assert batch_ms_for_world(50.0, 32) == 100.0 and batch_ms_for_world(50.0, 64) == 200.0
    assert batch_ms_for_world(50.0, 100_000) == MAX_SCALED_BATCH_MS  # silent ranks turn stale after 2 s
    assert batch_ms_for_world(800.0, 512) == 800.0  # never shorter than asked
