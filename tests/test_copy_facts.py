"""What the header and the report say of the copies is what the copy records say: a CPU has no
pinned memory (its loop copies pageable whatever was asked for, as its records and the
Prometheus labels say), and a user's job is counted from its records, not from the settings of
commtop's own loop (which it does not run)."""

from __future__ import annotations

from pathlib import Path

from tui.model.snapshot import RankView, Snapshot
from tui.recordings.reader import open_recording
from tui.report.build import build_report
from tui.view.widgets.header import header_text
from workers.wire.settings import Settings

RECORDINGS = Path(__file__).resolve().parent.parent / "recordings"


def _header(**fields) -> str:
    ranks = (RankView(rank=0, state="live", copies=fields.pop("copies", 0)),)
    snap = Snapshot(now_ns=1, ranks=ranks, world_size=1, settings=Settings(mode="overlap", copies=5), **fields)
    return header_text(snap).plain.split("\n")[1]


def test_the_header_says_pageable_on_a_cpu_and_pinned_on_a_gpu() -> None:
    assert "5 copies ×1 d2h pageable" in _header(backend="gloo", device="cpu")
    assert "5 copies ×1 d2h pinned" in _header(backend="nccl", device="NVIDIA H200")


def test_the_header_counts_a_user_jobs_copies_from_its_records() -> None:
    config = {"source": "monitor", "collective": "monitor: train.py"}
    line = _header(backend="nccl", device="NVIDIA H200", config=config, copies=197)
    assert "197 copies" in line and "5 copies" not in line and "pinned" not in line
    assert "no copies" in _header(backend="nccl", device="NVIDIA H200", config=config)


def test_the_report_takes_host_memory_from_the_records_of_a_cpu_run() -> None:
    with open_recording(RECORDINGS / "cpu-gloo-4ranks-all_gather-modes.commtop") as rec:
        assert rec.meta["settings"]["pinned"] is True  # asked for; a CPU cannot pin
        rows = [r for r in build_report(rec).rows if r.copy_count]
    assert rows and {r.pinned for r in rows} == {False}


def test_the_report_counts_a_captured_jobs_copies_from_its_records() -> None:
    with open_recording(RECORDINGS / "h200-train_ddp_plain-unmodified.commtop") as rec:
        copy = rec.tables().copy
        rows = [r for r in build_report(rec).rows if r.rank is None]  # one per stream, the same copies
    assert rows and len({(r.copies, r.direction, r.pinned) for r in rows}) == 1
    row = rows[0]
    steps = len({(int(r), int(s)) for r, s in zip(copy["rank"], copy["step"], strict=True)})
    assert row.copies == len(copy["step"]) / steps > 0  # the loop's settings said 0
    assert row.direction == "h2d"  # 142 of its 197 copies
    assert row.pinned is False  # 145 pageable, 52 pinned
