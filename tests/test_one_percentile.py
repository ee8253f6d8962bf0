"""One percentile definition: the live model, the headless summary and the report agree."""

from __future__ import annotations

from pathlib import Path

from recording_synth import synth_run, write_recording

from tui.model.run_model import RunModel
from tui.recordings.reader import open_recording
from tui.report.build import build_report
from tui.run.headless import format_summary


def test_model_headless_and_report_give_the_same_p50_and_p99_per_rank_and_mode(tmp_path: Path) -> None:
    items = list(synth_run(duration_s=5.0, world=2, telemetry=False, seed=11))
    path = tmp_path / "run.commtop"
    write_recording(path, items)
    model = RunModel(clock=lambda: items[-1][0])
    for t, message in items:
        model.apply(message, t)
    snap = model.snapshot(items[-1][0], fresh_run_stats=True)
    rec = open_recording(path)
    report = build_report(rec)
    compared = 0
    for row in report.rows:
        if row.rank is None:
            continue
        view = next(v for v in snap.ranks if v.rank == row.rank)
        st = view.run_by_mode[row.mode]
        assert st.exact and st.count == row.count
        assert (st.p50_ms, st.p99_ms) == (row.p50_us / 1e3, row.p99_us / 1e3), (row.rank, row.mode)
        assert st.p99_ms <= st.max_ms
        compared += 1
    assert compared == 2 * 3  # 2 ranks x 3 modes (one epoch each)
    table = format_summary(snap)
    for view in snap.ranks:
        for mode, st in view.run_by_mode.items():
            assert f"{st.p99_ms:.3f}" in table or f"{st.p99_ms:.2f}" in table, (mode, table)
