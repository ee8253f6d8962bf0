"""The headless summary of a user's job: its header, lost collectives, the step line and one line
per stream; the synthetic loop's summary keeps its modes and shows no stream block."""

from __future__ import annotations

from frozen_run import frozen_run
from job_synth import T0, expected_counts, job_run
from synthetic_ranks import stream_table, summary_table

from tui.model.run_model import RunModel
from tui.run.headless import format_summary
from tui.run.summary_views import STREAMS_TITLE


def summary_of(messages) -> str:
    model = RunModel(clock=lambda: T0)
    for m in messages:
        model.apply(m)
    return format_summary(model.snapshot(fresh_run_stats=True))


def test_a_jobs_summary_lists_every_stream_it_issued() -> None:
    text = summary_of(m for _, m in job_run(world=4, steps=50))
    rows = stream_table(text)
    got = {(r["group"].partition(":")[0], r["op"], r["dtype"], int(r["bytes"])): int(r["count"]) for r in rows}
    assert got == dict(expected_counts(4, 50))
    assert [r["group"] for r in rows if r["op"] == "all_to_all"] == ["1", "2:pair"]
    assert all(float(r["p50 ms"]) > 0 for r in rows)


def test_a_jobs_header_names_script_steps_groups_and_ops_and_no_modes() -> None:
    text = summary_of(m for _, m in job_run(world=4, steps=50))
    head = text.splitlines()[0]
    assert "job train.py (python hooks)" in head and "222.2 steps/s" in head
    assert "groups 0:default_pg (4), 1 (2), 2:pair (2)" in head
    assert "ops all_reduce, broadcast, all_to_all" in head
    assert "mode" not in head and "copies x1" not in text
    assert "mode" not in summary_table(text)[0]
    steps = next(line for line in text.splitlines() if line.startswith("steps: "))
    assert "step p50 4.500 ms" in steps and "copies d2h pinned 2/step 8 MiB/step" in steps


def test_missing_counts_what_a_rank_lost() -> None:
    text = summary_of(m for _, m in job_run(world=2, steps=20, lost={0: 5}))
    table = summary_table(text)
    assert (table[0]["missing"], table[0]["lost"], table[1]["missing"], table[1]["drops"]) == ("5", "5", "0", "0")


def test_the_synthetic_loops_summary_keeps_its_modes_and_has_no_stream_block() -> None:
    text = summary_of(frozen_run(world=2, iterations=400))
    assert "mode(s) none, overlap" in text.splitlines()[0]
    assert STREAMS_TITLE not in text and "lost" not in summary_table(text)[0]
    assert {r["mode"] for r in summary_table(text).values()} == {"none"}
