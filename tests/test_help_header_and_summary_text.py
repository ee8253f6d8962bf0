"""Small things a new user reads in the terminal: the help's long sentences wrap under
themselves, the compact header says the backend once, and the headless summary explains its
"~"."""

from __future__ import annotations

import io

import numpy as np
from frozen_run import frozen_coll, frozen_hello
from rich.console import Console

from tui.model.run_model import RunModel
from tui.model.snapshot import RankView, Snapshot
from tui.model.stats import RunAggregate
from tui.run.headless import format_summary
from tui.view.widgets.header import header_text
from tui.view.widgets.help import help_text
from workers.wire.settings import Settings

#: The help box's text width at its widest (108 columns, less border and padding).
HELP_W = 102


def test_a_long_help_sentence_wraps_under_itself_not_to_column_0() -> None:
    console = Console(width=HELP_W, record=True, file=io.StringIO())
    console.print(help_text(lambda action: True))
    lines = console.export_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("a  A/B experiment"))
    sentence_at = lines[at].index("A/B experiment")
    follow = lines[at + 1]
    assert follow.strip() and follow[:sentence_at].strip() == "", follow  # a hanging indent
    assert follow[sentence_at] != " "


def test_the_compact_header_says_the_backend_once() -> None:
    snap = Snapshot(
        now_ns=1,
        ranks=(RankView(rank=0, state="live"),),
        world_size=2,
        backend="gloo/cpu",
        device="cpu",
        collective="all_gather",
        shape=(512, 512),
        dtype="float32",
        settings=Settings(mode="overlap", copies=5),
    )
    first = header_text(snap, title="commtop run · 2 ranks · gloo/cpu", width=80).plain.split("\n")[0]
    assert first.count("gloo/cpu") == 1, first
    assert "world 2" in first


def test_the_summary_says_what_its_tilde_means() -> None:
    model = RunModel()
    n = RunAggregate.EXACT_CAP + 100  # past it, percentiles come from the histogram
    for r in range(2):
        model.apply(frozen_hello(r, 2))
        model.apply(frozen_coll(r, 0, np.arange(n), np.full(n, 2000.0 + r)))
    table = format_summary(model.snapshot(fresh_run_stats=True))
    rows = [ln for ln in table.splitlines() if ln.startswith(("0 ", "1 "))]
    assert rows and all("~" in ln for ln in rows)
    (note,) = [ln for ln in table.splitlines() if ln.startswith("~ ")]
    assert "log histogram, within ±1.2 %" in note and f"{RunAggregate.EXACT_CAP:,} collectives" in note


def test_an_exact_summary_has_no_tilde_note() -> None:
    model = RunModel()
    for r in range(2):
        model.apply(frozen_hello(r, 2))
        model.apply(frozen_coll(r, 0, np.arange(100), np.full(100, 2000.0)))
    table = format_summary(model.snapshot(fresh_run_stats=True))
    assert "~" not in table


def test_a_run_where_no_rank_reported_is_summarised_in_one_line() -> None:
    """The sweep: a job torchrun refused to start ended with 'backend ? · world size 0 · ? ? ?
    (0.0 MiB/rank) · mode(s) ?' over an empty table."""
    assert format_summary(RunModel().snapshot(fresh_run_stats=True)) == "commtop summary: no rank reported anything"


def test_a_job_that_made_no_process_group_is_told_so() -> None:
    """`commtop run -- python plain.py` of a script without torch.distributed: the ranks said
    Hello (backend unknown) and nothing else; the summary says why its table is empty."""
    import dataclasses

    from job_synth import T0, job_hello

    from tui.model.run_model import RunModel

    model = RunModel(clock=lambda: T0)
    for r in range(2):
        model.apply(dataclasses.replace(job_hello(r, 2, T0, groups=False), backend="unknown"), T0)
    text = format_summary(model.snapshot(fresh_run_stats=True))
    assert "no rank made a process group (torch.distributed): the job issued no collective to time" in text
    model.apply(dataclasses.replace(job_hello(0, 2, T0), backend="gloo/cpu"), T0)
    assert "no rank made a process group" not in format_summary(model.snapshot(fresh_run_stats=True))
