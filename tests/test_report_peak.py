"""`commtop report --peak FILE` (nccl-tests -J output) and the PCIe generation and width in the
report's peak line. The nccl-tests file is a small fake in nccl-tests' own JSON format
(tests/fixtures/nccl_tests/all_gather_perf_fake.json, src/util.cu JSON_FILE_VERSION 3: a null
out_of_place, a "nan" in_place); the recordings are real (CPU gloo, and the H200's)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tui import cli
from tui.report.nccl_tests import PeakFileError, load_peaks

ROOT = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).parent / "fixtures" / "nccl_tests" / "all_gather_perf_fake.json"
CPU = ROOT / "recordings" / "cpu-gloo-4ranks-all_gather-modes.commtop"
H200 = ROOT / "recordings" / "h200-nccl-1gpu-ab-none-overlap.commtop"


def test_the_nccl_tests_file_gives_the_best_busbw_per_size() -> None:
    m = load_peaks(str(FAKE))
    assert m.op == "all_gather" and m.program == "all_gather_perf"
    # the better of out-of-place and in-place; a null or "nan" side is skipped
    assert m.busbw == {1 << 20: 19.91, 2 << 20: 26.21, 4 << 20: 31.46, 8 << 20: 35.35}
    assert m.lookup(4 << 20) == (31.46, 4 << 20)
    assert m.lookup(5 << 20) == (31.46, 4 << 20)  # nearest measured size (log2)
    assert m.lookup(7 << 20) == (35.35, 8 << 20)
    assert m.best() == (35.35, 8 << 20)


@pytest.mark.e2e
def test_report_rows_are_shares_of_the_measured_peak(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(CPU), "--format", "json", "--peak", str(FAKE)]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [r for r in doc["rows"] if r["op"] == "all_gather"]
    assert rows and all(r["nbytes"] == 4 << 20 for r in rows)
    for r in rows:
        assert math.isclose(r["busbw_pct_measured"], r["busbw_gbps"] / 31.46 * 100, rel_tol=1e-9)
    assert doc["peaks"]["measured"][0]["op"] == "all_gather"
    assert cli.main(["report", str(CPU), "--peak", str(FAKE)]) == 0
    text = capsys.readouterr().out
    assert f"measured peaks (all_gather_perf, {FAKE}): all_gather busbw up to 35.4 GB/s (at 8 MiB), 4 sizes" in text
    assert "  all_gather 4 MiB: busbw " in text and "% of the measured 31.5 GB/s" in text
    # without --peak: no measured share
    assert cli.main(["report", str(CPU), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(r["busbw_pct_measured"] is None for r in doc["rows"]) and doc["peaks"]["measured"] == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json at all", "not JSON"),
        ('{"version": 3, "args": ["./all_gather_perf"]}', "no 'results' list"),
        ('{"args": ["./sendrecv_perf"], "results": []}', "'sendrecv_perf' is not an nccl-tests collective binary"),
        ('{"results": [{"size": 8}]}', "no 'args'"),
        ('{"args": ["all_reduce_perf"], "results": [{"size": 8, "in_place": {"bus_bw": "nan"}}]}', "no result with"),
    ],
)
@pytest.mark.e2e
def test_a_bad_peak_file_is_one_line_and_reads_no_recording(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert cli.main(["report", str(tmp_path / "no-such.commtop"), "--peak", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"commtop report: error: --peak {bad}: ") and message in err and err.count("\n") == 1, err
    with pytest.raises(PeakFileError):
        load_peaks(str(tmp_path / "missing.json"))


@pytest.mark.e2e
def test_peak_line_names_the_pcie_generation_and_width(capsys: pytest.CaptureFixture[str]) -> None:
    """From the node capability messages recorded beside the ticks (H200: Gen5 x16); the A/B
    verdict then says it as the live `commtop ab` did."""
    assert cli.main(["report", str(H200)]) == 0
    text = capsys.readouterr().out
    assert "link peaks (theoretical, from NVML): PCIe Gen5 x16 63.0 GB/s per direction; no NVLink" in text
    assert "= 87 % of PCIe Gen5 x16 (theoretical 63.0 GB/s)" in text
    assert cli.main(["report", str(H200), "--format", "json"]) == 0
    peaks = json.loads(capsys.readouterr().out)["peaks"]
    assert (peaks["pcie_gen"], peaks["pcie_width"]) == (5, 16)


def test_a_recording_without_capability_messages_says_unknown() -> None:
    from tui.report.peaks import Peaks, link_peaks

    assert link_peaks([], []).pcie_label == "PCIe (generation and width unknown)"
    assert "generation and width unknown" in Peaks(pcie_gbps=63.0).copy_share(55.0)
