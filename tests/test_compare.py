"""`commtop report A B`: recordings side by side per mode, ratios checked against numpy on
each recording's per-record CSV export (not against the report's own numbers)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from recording_synth import Epoch, synth_run, write_recording

from tui import cli

pytestmark = pytest.mark.e2e  # starts processes

EPOCHS = (Epoch(0.0, "none", copies=0), Epoch(2.0, "overlap"), Epoch(4.0, "sync"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A: the reference; B: every collective twice as slow; C: 2 ranks and only modes none + sync."""
    root = tmp_path_factory.mktemp("compare")
    made = {
        "a": synth_run(duration_s=6.0, world=4, epochs=EPOCHS, seed=1),
        "b": synth_run(duration_s=6.0, world=4, epochs=EPOCHS, base_us=5400.0, seed=2),
        "c": synth_run(duration_s=4.0, world=2, epochs=(EPOCHS[0], Epoch(2.0, "sync")), seed=3),
    }
    paths = {}
    for name, items in made.items():
        paths[name] = root / f"{name}.commtop"
        write_recording(paths[name], list(items))
    return paths


def call(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["report", *(str(a) for a in argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def medians_and_p99(capsys, path: Path) -> dict[str, tuple[float, float]]:
    """Per mode (p50, p99) in µs, from numpy on the per-record CSV export."""
    rc, out, _ = call(capsys, path, "--format", "csv", "--records")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    modes = np.array([r["mode"] for r in rows])
    dur = np.array([r["dur_us"] for r in rows], dtype=np.float64).astype(np.float32).astype(np.float64)
    return {m: (float(np.median(dur[modes == m])), float(np.percentile(dur[modes == m], 99))) for m in set(modes)}


def test_ratios_per_mode_match_numpy_on_each_recording(capsys, runs) -> None:
    a, b = medians_and_p99(capsys, runs["a"]), medians_and_p99(capsys, runs["b"])
    rc, out, err = call(capsys, runs["a"], runs["b"], "--format", "json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert [r["label"] for r in doc["recordings"]] == ["A", "B"] and doc["differs"] == []
    got = {(m["mode"], m["label"]): m for m in doc["modes"]}
    assert sorted(got) == [(m, x) for m in ("none", "overlap", "sync") for x in ("A", "B")]
    for mode in ("none", "overlap", "sync"):
        ra, rb = got[(mode, "A")], got[(mode, "B")]
        assert ra["p50_us"] == pytest.approx(a[mode][0], rel=1e-9)
        assert rb["p50_us"] == pytest.approx(b[mode][0], rel=1e-9)
        assert rb["p50_ratio"] == pytest.approx(b[mode][0] / a[mode][0], rel=1e-9)
        assert rb["p99_ratio"] == pytest.approx(b[mode][1] / a[mode][1], rel=1e-9)
        assert 1.8 < rb["p50_ratio"] < 2.2  # B was generated twice as slow
        assert ra["p50_ratio"] == pytest.approx(1.0)
    assert got[("none", "A")]["copy_gbps"] is None and got[("overlap", "A")]["copy_gbps"] > 0


def test_table_names_what_differs_and_a_mode_missing_from_the_reference(capsys, runs) -> None:
    rc, out, _ = call(capsys, runs["c"], runs["a"])
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "commtop report: 2 recordings compared, each against A"
    differs = next(ln for ln in lines if ln.strip().startswith("differs:"))
    assert "world 2 | 4" in differs
    overlap_b = next(ln for ln in lines if ln.startswith("overlap") and " B " in ln)
    assert overlap_b.split()[-4:] == ["n/a", "n/a", "no", "A"]  # C (the reference) has no overlap epoch
    sync_b = next(ln for ln in lines if ln.startswith("sync") and " B " in ln)
    assert sync_b.split()[-3].endswith("x") and sync_b.endswith("same settings")
    rc, out, _ = call(capsys, runs["a"], runs["a"])
    assert "same backend, world, collective, size, dtype, GPU, torch and NCCL" in out


def test_rows_are_grouped_by_the_full_settings_and_say_what_differs(capsys, tmp_path: Path) -> None:
    """Issue 16: sync with 5 pinned D2H copies in A against sync with 6 pageable H2D copies in B
    was one "sync" row pair under "same backend, world, collective, size"."""
    a_epochs = (Epoch(0.0, "none", copies=0), Epoch(2.0, "sync"))
    b_epochs = (
        Epoch(0.0, "none", copies=0),
        Epoch(2.0, "sync"),
        Epoch(4.0, "sync", copies=6, pinned=False, direction="h2d"),
    )
    paths = []
    for name, epochs, seconds in (("a", a_epochs, 4.0), ("b", b_epochs, 6.0)):
        paths.append(tmp_path / f"{name}.commtop")
        write_recording(paths[-1], list(synth_run(duration_s=seconds, world=2, epochs=epochs, seed=4)))
    rc, out, _ = call(capsys, *paths, "--format", "json")
    assert rc == 0
    rows = [(m["mode"], m["settings"], m["label"], m["versus"]) for m in json.loads(out)["modes"]]
    same = "5 copies x 128MiB, pinned, d2h"
    assert rows == [
        ("none", "-", "A", ""),
        ("none", "-", "B", ""),
        ("sync", same, "A", ""),
        ("sync", same, "B", ""),
        ("sync", "6 copies x 128MiB, pageable, h2d", "B", "copies 6 (A 5), pageable (A pinned), h2d (A d2h)"),
    ]
    rc, out, _ = call(capsys, *paths)
    changed = next(ln for ln in out.splitlines() if "6 copies" in ln)
    assert changed.endswith("copies 6 (A 5), pageable (A pinned), h2d (A d2h)")
    assert next(ln for ln in out.splitlines() if ln.startswith("sync") and " B " in ln).endswith("same settings")


def test_csv_has_one_row_per_mode_and_recording(capsys, runs, tmp_path: Path) -> None:
    out_path = tmp_path / "cmp.csv"
    rc, out, _ = call(capsys, runs["a"], runs["b"], runs["c"], "--format", "csv", "-o", out_path)
    assert rc == 0 and out == ""
    rows = list(csv.DictReader(out_path.open()))
    assert {(r["mode"], r["label"]) for r in rows} == {
        *((m, x) for m in ("none", "overlap", "sync") for x in ("A", "B")),
        ("none", "C"),
        ("sync", "C"),
    }
    assert all(r["path"].endswith(".commtop") and int(r["count"]) > 0 for r in rows)


def test_compare_errors_are_one_line(capsys, runs, tmp_path: Path) -> None:
    rc, out, err = call(capsys, runs["a"], runs["b"], "--trace", tmp_path / "t.json")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "take one recording" in err
    bogus = tmp_path / "not.commtop"
    bogus.write_bytes(b"hello")
    rc, out, err = call(capsys, runs["a"], bogus)
    assert rc == 1 and out == "" and err.startswith("commtop report: error:") and err.count("\n") == 1


def test_modes_carry_p50_per_overlap_class(capsys, runs) -> None:
    """Each mode's p50 per overlap class equals numpy's on the records CSV's class column."""
    rc, out, _ = call(capsys, runs["a"], "--format", "csv", "--records")
    rows = list(csv.DictReader(io.StringIO(out)))
    modes = np.array([r["mode"] for r in rows])
    classes = np.array([r["overlap"] for r in rows])
    dur = np.array([r["dur_us"] for r in rows], dtype=np.float64).astype(np.float32).astype(np.float64)
    rc, out, _ = call(capsys, runs["a"], runs["b"], "--format", "json")
    assert rc == 0
    seen = 0
    for row in json.loads(out)["modes"]:
        if row["label"] != "A":
            continue
        for key in ("during", "after", "none"):
            sel = (modes == row["mode"]) & (classes == key)
            if sel.any():
                assert row[f"{key}_p50_us"] == pytest.approx(float(np.median(dur[sel])), rel=1e-9)
                seen += 1
            else:
                assert row[f"{key}_p50_us"] is None
    assert seen >= 3
