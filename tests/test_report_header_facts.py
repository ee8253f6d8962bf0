"""The facts at the top of `commtop report`: a window's report says the window's length, and a
comparison says what a run without NCCL had instead of "?". The real CLI on the real
recordings of the repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tui import cli

pytestmark = pytest.mark.e2e  # starts processes

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "recordings" / "cpu-gloo-4ranks-all_gather-modes.commtop"
H200 = ROOT / "recordings" / "h200-nccl-1gpu-all_gather-modes.commtop"


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(["report", *argv]) == 0
    return capsys.readouterr().out


def test_a_window_report_says_the_windows_length(capsys) -> None:
    out = _report(capsys, str(H200), "--window", "10:20")
    assert " in 10.0 s of recording (seconds 10-20 after the first record, --window);" in out.splitlines()[1]
    doc = json.loads(_report(capsys, str(H200), "--window", "10:20", "--format", "json"))
    assert doc["duration_s"] == pytest.approx(10.0) and doc["window_s"] == [10.0, 20.0]
    tail = _report(capsys, str(H200), "--window", "30:")  # open end: up to the recording's end
    assert " in 11.6 s of recording (seconds 30-41.6 after the first record, --window);" in tail.splitlines()[1]
    whole = _report(capsys, str(H200))
    assert " in 41.6 s of recording; " in whole.splitlines()[1]


def test_a_comparison_says_what_the_run_without_nccl_had(capsys) -> None:
    out = _report(capsys, str(H200), str(CPU))
    assert "nccl 2.28.9 | gloo, no NCCL" in out
    assert "?" not in out.split("differs:")[1].splitlines()[0]
    assert "torch 2.13.0+cpu · no NCCL · " in out and "nccl ?" not in out
    windowed = _report(capsys, str(H200), str(CPU), "--window", "10:20")
    assert windowed.count("records in 10.0 s of recording (seconds 10-20 after the first record, --window)") == 2
