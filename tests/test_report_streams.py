"""`commtop report` of a user's job: one row per (epoch, rank, group, op, dtype, size), the
step view, the groups' stragglers, what is missing, `report A B` per stream, the trace and the
plot name streams; the synthetic loop keeps its settings columns and modes."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from job_synth import COPY_BYTES, STEP_NS, expected_counts, job_run
from recording_synth import synth_run, write_recording

from tui import cli
from workers.wire import protocol as p
from workers.wire.stats import percentiles

ROOT = Path(__file__).parent.parent
OLD_JOB = ROOT / "recordings" / "h200-train_ddp_plain-unmodified.commtop"  # schema 1: no groups, no dtypes


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, list]:
    items = list(job_run(world=4, steps=60, lost={1: 3}, slow_rank=2))
    path = tmp_path_factory.mktemp("job") / "job.commtop"
    write_recording(path, items)
    return path, items


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("loop") / "loop.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=2, seed=5)))
    return path


def call(capsys, *argv: str) -> str:
    rc = cli.main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.e2e
def test_csv_counts_per_group_op_dtype_and_size_are_what_the_job_issued(capsys, job) -> None:
    path, _ = job
    rows = csv_rows(call(capsys, path, "--format", "csv"))
    every = Counter()
    per_rank = Counter()
    for r in rows:
        key = (r["group"], r["op"], r["dtype"], int(r["nbytes"]))
        (every if r["rank"] == "" else per_rank)[key] += int(r["count"])
    assert every == expected_counts(4, 60) == per_rank
    assert {r["group_desc"] for r in rows if r["group"] == "0"} == {"default_pg"}
    assert {(r["group"], r["group_size"]) for r in rows} == {("0", "4"), ("1", "2"), ("2", "2")}
    # one row per (epoch, rank or all, group, op, dtype, nbytes)
    keys = [(r["epoch"], r["rank"], r["group"], r["op"], r["dtype"], r["nbytes"]) for r in rows]
    assert len(keys) == len(set(keys)) == 6 + 4 * 5  # 6 streams, each rank in 5 of them


@pytest.mark.e2e
def test_a_jobs_csv_has_no_synthetic_settings_the_loops_keeps_them(capsys, job, loop) -> None:
    head = call(capsys, job[0], "--format", "csv").splitlines()[0].split(",")
    assert head[:9] == ["epoch", "rank", "group", "group_desc", "group_size", "op", "dtype", "nbytes", "count"]
    for name in ("mode", "copies", "copy_bytes", "pinned", "direction", "slowdown"):
        assert name not in head
    assert {"total_ms", "step_share", "busbw_gbps", "p99_us"} <= set(head)
    loop_rows = csv_rows(call(capsys, loop, "--format", "csv"))
    assert {"mode", "copies", "slowdown", "group", "dtype"} <= set(loop_rows[0])
    assert {(r["group"], r["group_desc"], r["dtype"]) for r in loop_rows} == {("0", "", "?")}


@pytest.mark.e2e
def test_stream_rows_match_numpy_on_the_records(capsys, job) -> None:
    path, items = job
    rows = csv_rows(call(capsys, path, "--format", "csv"))
    records = csv_rows(call(capsys, path, "--format", "csv", "--records"))
    for r in rows:
        mine = [
            x
            for x in records
            if (x["group"], x["op"], x["dtype"], x["nbytes"]) == (r["group"], r["op"], r["dtype"], r["nbytes"])
            and (r["rank"] == "" or x["rank"] == r["rank"])
        ]
        dur = np.array([float(x["dur_us"]) for x in mine], dtype=np.float32)
        assert int(r["count"]) == len(dur)
        p50, p99 = percentiles(dur, (50, 99))
        assert float(r["p50_us"]) == pytest.approx(p50, rel=1e-6) and float(r["p99_us"]) == pytest.approx(p99, rel=1e-6)
        assert float(r["total_ms"]) == pytest.approx(float(dur.astype(np.float64).sum()) / 1e3, rel=1e-6)
        busbw = np.array([float(x["busbw"]) for x in mine])  # each record's: S / t x the op's factor
        at_mean = float((busbw * dur).sum() / dur.astype(np.float64).sum())  # = S / mean t x factor
        assert float(r["busbw_gbps"]) == pytest.approx(at_mean, rel=1e-5, abs=1e-9)


@pytest.mark.e2e
def test_step_view_groups_stragglers_and_missing_in_json(capsys, job) -> None:
    doc = json.loads(call(capsys, job[0], "--format", "json"))
    every = next(s for s in doc["steps"] if s["rank"] is None)
    assert every["steps"] == 4 * 60 and every["steps_per_s"] == pytest.approx(1e9 / STEP_NS)
    assert every["step_p50_ms"] == pytest.approx(STEP_NS / 1e6)
    (copies,) = every["copies"]
    assert (copies["direction"], copies["pinned"], copies["per_step"], copies["bytes_per_step"]) == (
        "d2h",
        True,
        2.0,
        2.0 * COPY_BYTES,
    )
    groups = {g["group"]: g for g in doc["groups"]}
    assert groups["0"]["straggler"] == 2 and groups["2"]["straggler"] == 2 and groups["1"]["straggler"] is None
    assert groups["1"]["ranks"] == [0, 1] and groups["0"]["streams"] == 4
    assert [(r["rank"], r["lost"], r["missing"]) for r in doc["ranks"]] == [(0, 0, 0), (1, 3, 3), (2, 0, 0), (3, 0, 0)]
    assert doc["missing"] == 3 and doc["job"]["script"] == "train.py" and doc["modes"] == []
    assert "mode" not in doc["rows"][0] and {s["op"] for s in doc["streams"]} == {
        "all_reduce",
        "all_to_all",
        "broadcast",
    }


@pytest.mark.e2e
def test_a_jobs_table_names_the_script_steps_groups_and_ops_not_the_loops_settings(capsys, job) -> None:
    text = call(capsys, job[0])
    assert "job train.py (python hooks) · 222.2 steps/s · groups 0:default_pg (4), 1 (2), 2:pair (2)" in text
    assert "ops all_reduce, broadcast, all_to_all" in text
    for loop_word in ("slowdown", "copies   size", "per mode", "mode "):
        assert loop_word not in text
    assert "rank 2 (last in 100 % of 60 steps)" in text
    assert "missing 3 collectives (iteration gaps 0 + lost by the ranks 3)" in text
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("per stream"))
    assert lines[i + 1].split()[:6] == ["epoch", "group", "op", "dtype", "size", "n"]
    assert sum(1 for line in lines[i + 2 : i + 8] if line.split()[0] == "0") == 6


@pytest.mark.e2e
def test_a_recording_made_before_groups_reads_as_the_world_group(capsys) -> None:
    rows = csv_rows(call(capsys, OLD_JOB, "--format", "csv"))
    assert {(r["group"], r["dtype"]) for r in rows} == {("0", "?")}
    assert sum(int(r["count"]) for r in rows if r["rank"] == "") == 253
    assert len({(r["op"], r["nbytes"]) for r in rows}) == 9


@pytest.mark.e2e
def test_report_a_b_of_two_jobs_compares_per_stream(capsys, job, tmp_path: Path) -> None:
    other = tmp_path / "b.commtop"
    write_recording(other, list(job_run(world=4, steps=30, seed=9)))
    text = call(capsys, job[0], other)
    assert "? ?" not in text and "job train.py" in text
    assert "per stream (all ranks and epochs)" in text
    doc = json.loads(call(capsys, job[0], other, "--format", "json"))
    streams = {(s["group"], s["op"], s["nbytes"], s["label"]): s for s in doc["streams"]}
    assert len(streams) == 12
    b = streams[("0:default_pg", "all_reduce", 4194304, "B")]
    a = streams[("0:default_pg", "all_reduce", 4194304, "A")]
    assert b["count"] == 120 and b["p50_ratio"] == pytest.approx(b["p50_us"] / a["p50_us"])
    rows = csv_rows(call(capsys, job[0], other, "--format", "csv"))
    assert len(rows) == 12 and {"group", "op", "dtype", "nbytes", "p50_ratio"} <= set(rows[0])


@pytest.mark.e2e
def test_the_trace_names_each_collectives_stream(capsys, job, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    cli.main(["report", str(job[0]), "--trace", str(out)])
    capsys.readouterr()
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "collective"]
    names = Counter(e["name"] for e in events)
    assert names["all_reduce 4MiB float32 · group 0:default_pg"] == 240
    assert names["all_to_all 64KiB bfloat16 · group 2:pair"] == 120
    e = next(e for e in events if e["args"]["op"] == "broadcast")
    assert (e["args"]["group"], e["args"]["group_desc"], e["args"]["dtype"], e["args"]["nbytes"]) == (
        "0",
        "default_pg",
        "int64",
        8,
    )


def test_the_plot_colours_a_job_by_stream_and_the_loop_by_mode(job, loop, tmp_path: Path, monkeypatch) -> None:
    import matplotlib.figure

    from tui.recordings.reader import open_recording
    from tui.report.plot import plot_recording

    legends: list[list[str]] = []
    save = matplotlib.figure.Figure.savefig

    def keep(fig: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        legends.append([t.get_text() for t in fig.axes[0].get_legend().get_texts()])
        save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    for path in (job[0], loop):
        with open_recording(path) as rec:
            plot_recording(rec, rec.tables(), str(tmp_path / "p.png"))
    by_stream, by_mode = legends
    assert len(by_stream) == 6 and "2:pair all_to_all bfloat16 64KiB" in by_stream
    assert by_mode == ["none", "overlap"]  # 3 s of DEFAULT_EPOCHS: sync starts at 4 s


@pytest.mark.e2e
def test_the_records_csv_names_groups_and_dtypes(capsys, job) -> None:
    records = csv_rows(call(capsys, job[0], "--format", "csv", "--records"))
    assert Counter((r["group"], r["dtype"]) for r in records) == {
        ("0", "float32"): 720,
        ("0", "int64"): 24,
        ("1", "bfloat16"): 120,
        ("2", "bfloat16"): 120,
    }
    assert p.DTYPES[0] == "?"


def test_a_recording_started_mid_run_counts_only_what_was_lost_while_it_recorded() -> None:
    from dataclasses import replace

    from job_synth import T0, job_hello

    from tui.report.groups_report import rank_rows

    early = replace(job_hello(0, 1, T0, lost=40), iteration=500)  # the recorder started late: 40 lost before
    late = replace(job_hello(0, 1, T0, lost=47), iteration=900)
    (row,) = rank_rows([0], {0: 395}, {0: (500, 899)}, [(1, early), (2, late)])
    assert (row.gaps, row.lost, row.missing) == (5, 7, 12)
    first = replace(job_hello(0, 1, T0, lost=2), iteration=0)  # from the rank's start: all of it
    (row,) = rank_rows([0], {0: 10}, {0: (0, 9)}, [(1, first), (2, late)])
    assert (row.gaps, row.lost) == (0, 47)
    # a rank whose first Hello came after its first collectives (a loaded machine; DDP's 5 unseen
    # set-up collectives already in its count), recorded from its first collective: all of it
    # (the report said 51 + 0 where the live summary said 51 + 5)
    slow = replace(job_hello(0, 1, T0, lost=5), iteration=12)
    (row,) = rank_rows([0], {0: 51}, {0: (0, 50)}, [(1, slow), (2, replace(slow, iteration=51))])
    assert (row.gaps, row.lost) == (0, 5)


@pytest.mark.e2e
def test_a_streams_busbw_is_the_live_views_at_the_average_duration(capsys, job) -> None:
    """The report's per-stream busbw and the live stream table's are one number: busbw at the
    stream's average duration, as nccl-tests gives it (the report took the mean of the records'
    own rates, higher where some records are fast)."""
    from tui.model.run_model import RunModel

    path, items = job
    model = RunModel()
    for _, message in items:
        model.apply(message)
    live = {(s.op, s.nbytes, s.group): s for s in model.snapshot(fresh_run_stats=True).streams if s.op != "other"}
    doc = json.loads(call(capsys, path, "--format", "json"))
    report = {(s["op"], s["nbytes"], s["group"].split(":")[0]): s for s in doc["streams"]}
    assert set(live) == set(report)
    spread = 0.0
    for key, view in live.items():
        assert report[key]["busbw_gbps"] == pytest.approx(view.busbw_gbps, rel=1e-4), key
        spread = max(spread, report[key]["p99_us"] / report[key]["p50_us"])
    assert spread > 1.05  # durations that vary: the mean of the records' rates would differ
