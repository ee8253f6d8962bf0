"""A report says how the recorded job ended, from its ranks' Byes: which rank failed first and
with what error (its own, not a peer's "Connection closed by peer"), how the others ended, or
that every rank finished or was stopped; nothing where the recording holds no Bye."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest
from job_synth import job_run
from recording_synth import write_recording

from tui import cli
from tui.model.streams import group_label
from tui.report.endings import job_ending
from workers.wire import protocol as p

T0 = 1_000_000_000_000
PEER = "RuntimeError: [../pair.cc:553] Connection closed by peer [127.0.0.1]:21892"


def byes(*items: tuple[int, int, str, float]) -> list[tuple[int, p.Bye]]:
    """(rank, exit code, reason, seconds after T0) -> (recv_ns, Bye), in the order given."""
    return [(T0 + int(s * 1e9) + 1000, p.Bye(r, code, why, T0 + int(s * 1e9))) for r, code, why, s in items]


def test_the_first_failure_is_the_rank_whose_error_is_its_own_even_when_a_peer_said_bye_first() -> None:
    ending = job_ending(
        byes((0, 1, PEER, 0.30), (1, 1, "ValueError: bad shape", 0.35), (0, -15, "killed by SIGTERM", 0.9)), T0
    )
    assert ending.verdict == "failed"
    assert ending.first is not None and (ending.first.rank, ending.first.code) == (1, 1)
    assert ending.by_rank == {0: "killed by SIGTERM", 1: "exit code 1"}  # each rank's last Bye
    assert ending.line([0, 1]) == (
        "ended: failed, rank 1 first (exit code 1, 0.3 s in): ValueError: bad shape; rank 0 killed by SIGTERM"
    )


def test_a_rank_stopped_in_its_teardown_did_not_fail_first_as_the_live_summary_said() -> None:
    """Both ranks raise the same error; rank 0 says so first, but rank 1 exits first and torchrun
    stops rank 0 in its teardown: the live summary said rank 1 failed first, the report said
    "rank 0 first (exit code 1 ...)" beside "rank 0: killed by SIGTERM" in its own JSON."""
    err = "RuntimeError: failure at step 5"
    stop = "killed by SIGTERM (stopped by torchrun after rank 1 failed)"
    ending = job_ending(byes((0, 1, err, 0.30), (1, 1, err, 0.35), (0, -15, stop, 0.9)), T0)
    assert ending.first is not None and (ending.first.rank, ending.first.code) == (1, 1)
    assert (
        ending.line([0, 1]) == f"ended: failed, rank 1 first (exit code 1, 0.3 s in): {err}; rank 0 killed by SIGTERM"
    )


def test_among_errors_of_their_own_the_earliest_fails_first_and_a_signal_other_than_a_stop_is_a_failure() -> None:
    ending = job_ending(byes((2, 1, "OSError: disk full", 2.0), (3, -9, "killed by SIGKILL", 1.5)), T0)
    assert ending.first is not None and ending.first.rank == 3
    assert ending.line([0, 1, 2, 3]).startswith("ended: failed, rank 3 first (killed by SIGKILL, 1.5 s in)")
    assert ending.line([0, 1, 2, 3]).endswith("rank 2 exit code 1, ranks 0-1 no end recorded")


def test_a_stopped_or_finished_job_did_not_fail_and_no_bye_says_nothing() -> None:
    stopped = job_ending(byes((0, -15, "stopped by SIGTERM", 1), (1, -2, "", 1)), T0)
    assert stopped.first is None and stopped.verdict == "stopped"
    assert stopped.line([0, 1]) == "ended: rank 0 killed by SIGTERM, rank 1 killed by SIGINT"
    finished = job_ending(byes(*((r, 0, "finished", 1) for r in (0, 1, 2, 4))), T0)
    assert finished.verdict == "finished"
    assert finished.line([0, 1, 2, 4]) == "ended: ranks 0-2,4 finished"
    assert job_ending([], T0).line([0, 1]) == ""


def report(path: Path, *fmt: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["report", str(path), *fmt]) == 0
    return buf.getvalue()


@pytest.mark.e2e  # the report looks for libraries with ldconfig
def test_the_report_of_a_failed_jobs_recording_says_it_failed_in_text_and_json(tmp_path: Path) -> None:
    items = [item for item in job_run(world=4, steps=20) if not isinstance(item[1], p.Bye)]
    end = items[-1][0] + 1_000_000
    items += [
        (end, p.Bye(0, 1, PEER, end)),
        (end + 10, p.Bye(2, 1, "RuntimeError: CUDA out of memory", end + 5)),
        (end + 20, p.Bye(1, -15, "killed by SIGTERM (stopped by torchrun after rank 2 failed)", end + 20)),
    ]
    path = tmp_path / "failed.commtop"
    write_recording(path, items)
    text = report(path)
    line = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("ended:"))
    assert line.startswith("ended: failed, rank 2 first (exit code 1, ")
    assert line.endswith(
        "RuntimeError: CUDA out of memory; rank 0 exit code 1, rank 1 killed by SIGTERM, rank 3 no end recorded"
    )
    doc = json.loads(report(path, "--format", "json"))
    assert doc["ended"] == "failed" and doc["first_failure"]["rank"] == 2
    assert [r["ended"] for r in doc["ranks"]] == ["exit code 1", "killed by SIGTERM", "exit code 1", None]
    assert "longest waits" not in text and all(r["longest_wait"] is None for r in doc["ranks"])


def test_the_report_names_each_ranks_longest_wait_inside_one_collective(tmp_path: Path) -> None:
    """A hang, recorded: rank 0's Hellos said it was inside an all_reduce for 1, then 12.5 s (its
    peer never came); rank 1's, 0.5 s in one (a normal wait: under LONG_WAIT_S, not named)."""
    items = list(job_run(world=2, steps=20))
    end = max(t for t, _ in items)
    first = next(m for _, m in items if isinstance(m, p.Hello) and m.rank == 0)
    groups = first.groups
    all_reduce = p.OP_NAMES.index("all_reduce")
    for rank, waited in ((1, 0.5), (0, 1.0), (0, 12.5)):  # in arrival order
        t = end + int(waited * 1e9)
        hello = dataclasses.replace(first, rank=rank, t_ns=t, groups=groups, inside=(all_reduce, 0, 4096, end))
        items.append((t, hello))
    path = tmp_path / "hung.commtop"
    write_recording(path, items)
    text = report(path)
    line = next(ln.strip() for ln in text.splitlines() if "longest waits" in ln)
    assert (
        line
        == f"longest waits inside a collective: rank 0 inside all_reduce on {group_label(*groups[0][:2])} (4,096 B), 12.5 s"
    )
    doc = json.loads(report(path, "--format", "json"))
    assert [r["longest_wait"] is not None for r in doc["ranks"]] == [True, False]


def test_the_launchers_word_on_an_exit_code_is_not_repeated_as_the_reason_the_ranks_own_words_are() -> None:
    launcher = "exit code 3 (failed first) (reported by torchrun)"
    assert (
        job_ending(byes((0, 3, launcher, 1.0)), T0).line([0]) == "ended: failed, rank 0 first (exit code 3, 1.0 s in)"
    )
    both = job_ending(byes((0, 3, "SystemExit: 3", 0.9), (0, 3, launcher, 1.0)), T0)
    assert both.first is not None and both.first.reason == "SystemExit: 3"


def test_a_job_torchrun_restarted_ends_as_its_last_attempt_did_and_says_it_restarted() -> None:
    """torchrun --max-restarts 1: rank 1 fails in the first attempt (rank 0 sees the peer gone),
    both ranks start again in new processes and finish. The report said "ended: failed, rank 1
    first" for a job that exited 0 (QA); the earlier attempt's failure is said as such."""
    from frozen_run import frozen_hello

    def hello(rank: int, pid: int, s: float) -> tuple[int, p.Hello]:
        return (T0 + int(s * 1e9), frozen_hello(rank, 2, t_ns=T0 + int(s * 1e9), pid=pid))

    hellos = [hello(0, 100, 0.1), hello(1, 101, 0.1), hello(0, 200, 1.0), hello(1, 201, 1.0)]
    attempts = byes((1, 1, "RuntimeError: attempt 0 failed", 0.4), (0, 1, PEER, 0.45), (0, 0, "", 2.0), (1, 0, "", 2.1))
    ending = job_ending(attempts, T0, hellos)
    assert (ending.verdict, ending.first, ending.restarts) == ("finished", None, 1)
    assert ending.line([0, 1]) == (
        "ended: ranks 0-1 finished (after 1 restart; before: rank 1 failed first, 0.4 s in: "
        "RuntimeError: attempt 0 failed)"
    )
    # the last attempt failing too: its own failure ends the job
    again = job_ending([*attempts[:2], *byes((0, 1, "ValueError: attempt 1", 2.0), (1, -15, "", 2.1))], T0, hellos)
    assert again.first is not None and (again.first.rank, again.first.reason) == (0, "ValueError: attempt 1")
    assert again.before_restart is not None and again.before_restart.rank == 1


def test_a_job_without_steps_has_no_step_table() -> None:
    """A job that marks no steps has all its records in step 0: one step "begun" per rank and no
    step time. The report printed a table of 'n/a' rows for it (QA7); the live summary had none."""
    import math

    from tui.report.rows import StepRow
    from tui.report.views_text import step_table

    def row(rank: int | None, p50: float) -> StepRow:
        return StepRow(0, rank, 1, math.nan, p50, p50, math.nan, math.nan, (), math.nan)

    assert step_table([row(None, math.nan), row(0, math.nan), row(1, math.nan)]) == []
    assert any(line.split()[:3] == ["epoch", "rank", "steps"] for line in step_table([row(None, 5.0), row(0, 5.0)]))
