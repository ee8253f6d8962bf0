"""What the report, trace and plot commands print and write, on the recordings in the
repository (a real 4-rank gloo run on a CPU, a real 1-GPU NCCL run on an H200)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tui import cli
from tui.report.build import build_report

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "recordings" / "cpu-gloo-4ranks-all_gather-modes.commtop"
H200 = ROOT / "recordings" / "h200-nccl-1gpu-all_gather-modes.commtop"


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.e2e
def test_the_footnote_names_how_latency_was_measured(capsys) -> None:
    _, cpu, _ = _report(capsys, str(CPU))
    _, gpu, _ = _report(capsys, str(H200))
    assert "CUDA" not in cpu and "host clock around each call: gloo/cpu" in cpu
    assert "CUPTI records, or CUDA events on the GPU" in gpu and "host clock" not in gpu


@pytest.mark.e2e
def test_none_rows_show_no_copy_settings(capsys) -> None:
    _, out, _ = _report(capsys, str(CPU))
    main_table = out.split("per mode (all ranks)")[0]  # the overlap-class table below has its own columns
    rows = [ln.split() for ln in main_table.splitlines() if ln.split()[:2] in (["0", "none"], ["1", "overlap"])]
    none_rows = [r for r in rows if r[1] == "none"]
    overlap = [r for r in rows if r[1] == "overlap"]
    assert none_rows and overlap
    assert all(r[2:6] == ["-", "-", "-", "-"] for r in none_rows), none_rows  # copies, size, pin, dir
    # pin "no": a CPU cannot pin host memory, and its copy records say so
    assert all(r[2:6] == ["5", "1MiB", "no", "d2h"] for r in overlap), overlap


@pytest.mark.e2e
def test_csv_copies_are_integers_and_rank_is_a_number_or_empty(capsys) -> None:
    _, out, _ = _report(capsys, str(CPU), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows
    for row in rows:
        assert row["rank"] == "" or row["rank"].isdigit(), row["rank"]  # empty: all ranks
        if row["mode"] == "none":
            assert row["copies"] == row["pinned"] == row["direction"] == ""
        else:
            assert row["copies"].isdigit(), row["copies"]
    assert {row["rank"] for row in rows} == {"", "0", "1", "2", "3"}


@pytest.mark.e2e
def test_trace_process_names_of_cpu_ranks(capsys, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert cli.main(["report", str(CPU), "--trace", str(out)]) == 0
    capsys.readouterr()
    names = [e["args"]["name"] for e in json.loads(out.read_text())["traceEvents"] if e.get("name") == "process_name"]
    ranks = [n for n in names if n.startswith("rank ")]
    assert len(ranks) == 4 and all(n.endswith(" · cpu") for n in ranks), ranks
    assert not any("-1" in n for n in names), names


@pytest.mark.e2e
def test_a_cut_recording_is_warned_about_once(capsys, tmp_path: Path) -> None:
    cut = tmp_path / "cut.commtop"
    cut.write_bytes(CPU.read_bytes()[:300_000])
    code, out, err = _report(capsys, str(cut))
    assert code == 0 and err == ""
    assert out.count("recording incomplete: cut at byte") == 1
    code, out, err = _report(capsys, str(cut), "--format", "csv")
    assert code == 0 and err.count("recording incomplete") == 1 and err.count("\n") == 1
    assert "incomplete" not in out


@pytest.mark.e2e
def test_a_recording_cut_inside_its_header_is_one_line_for_report_and_replay(tmp_path: Path) -> None:
    cut = tmp_path / "cut100.commtop"
    cut.write_bytes(CPU.read_bytes()[:100])
    for sub in ("report", "replay"):
        proc = subprocess.run(
            [sys.executable, "-m", "tui.cli", sub, str(cut)], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert proc.returncode == 1, (sub, proc.stdout[-500:])
        assert (
            proc.stderr
            == f"commtop {sub}: error: {cut} ends inside its header (at byte 12 of 100): no records to read\n"
        )
        assert "ranks to connect" not in proc.stdout


def test_plot_labels_every_settings_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.figure  # a dev dependency

    from tui.recordings.reader import open_recording
    from tui.report.plot import plot_recording

    texts: list[str] = []
    save = matplotlib.figure.Figure.savefig

    def keep_texts(fig: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep_texts)
    with open_recording(CPU) as rec:
        plot_recording(rec, rec.tables(), str(tmp_path / "p.png"))
        epochs = {r.epoch: r.mode for r in build_report(rec, rec.tables()).rows}
    assert (tmp_path / "p.png").stat().st_size > 10_000
    expected = [f"epoch {e}: {m}" for e, m in sorted(epochs.items()) if e > min(epochs)]
    assert [t for t in texts if t.startswith("epoch")] == expected, texts
