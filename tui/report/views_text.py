"""The views of a job in the report's table: the job's line (script, steps/s, groups, ops), one
row per stream (all ranks; per rank in the CSV and JSON), the step view, the groups with their
stragglers, and what is missing per rank."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tui.model.steps import StepView
from tui.model.streams import SUMMARY_GROUPS, listed
from tui.report.rows import GroupRow, RankRow, Report, Row, StepRow
from tui.report.table_text import aligned_table, fmt_num

#: Ranks whose own step rows the table shows (more: only all ranks; the JSON has every rank).
STEP_RANKS_SHOWN = 16


def job_line(report: Report) -> str:
    """ "job train.py (python hooks) · 222.2 steps/s · groups 0:default_pg (4), 1 (2) · ops all_reduce"."""
    job = report.job
    parts = [f"job {job.script}" + (f" ({job.capture})" if job.capture else "")]
    rates = [s.steps_per_s for s in report.steps if s.rank is None and math.isfinite(s.steps_per_s)]
    if rates:
        parts.append(f"{max(rates):,.1f} steps/s")
    if report.groups:
        named = [f"{g.group_text} ({g.size or len(g.ranks)})" for g in report.groups]
        parts.append("groups " + listed(named, SUMMARY_GROUPS))
    ops = list(dict.fromkeys(s.op for s in report.streams))
    if ops:
        parts.append("ops " + ", ".join(ops))
    return " · ".join(parts)


def size_cell(n: int) -> str:
    """ "4MiB", "1.004MiB", "2000B", "8B": a whole unit where the size is one; below 1 MiB
    otherwise the bytes themselves (a 2000-byte tensor reads as 2000B, as nccl-tests prints
    sizes, not 1.953KiB); above it four significant digits."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
        if n >= size and size > 1 << 10:
            return f"{n / size:.4g}{unit}"
    return f"{n}B"


def _ms(us: float) -> str:
    return fmt_num(us / 1e3, "{:.3f}")


def size_text(nbytes: float) -> str:
    """ "8 MiB", "196.9 MiB", "512 B": three significant digits at most."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.4g} {unit}" if nbytes / size < 1000 else f"{nbytes / size:.0f} {unit}"
    return f"{nbytes:.0f} B"


def step_line(v: StepView, *, beside_live_rate: bool = False) -> str:
    """One line of the step view (the headless summary, the TUI): steps/s, step time p50/p99,
    collectives per step, copies per step, collectives during copies per step.
    ``beside_live_rate``: the TUI's header also shows a steps/s, over the newest seconds; this
    one is the whole run's, and says so there (two unlabelled rates that differ read as a bug)."""
    if not v.has_steps:
        return ""
    approx = "" if v.step.exact else "~"
    lead = "steps (whole run)" if beside_live_rate else "steps"
    parts = [
        f"{lead}: {v.steps_per_s:,.1f}/s" if math.isfinite(v.steps_per_s) else f"{lead}: -",
        f"step p50 {approx}{_ms3(v.step.p50_ms)} ms p99 {approx}{_ms3(v.step.p99_ms)} ms",
    ]
    share = v.coll_share
    coll = f"collectives {_ms3(v.coll_ms_per_step)} ms/step"
    parts.append(coll + (f" ({share * 100:.0f} % of a step)" if math.isfinite(share) else ""))
    for c in v.copies:
        gbps = f"{c.gbps:.2f} GB/s" if math.isfinite(c.gbps) else "- GB/s"
        memory = "pinned" if c.pinned else "pageable"
        parts.append(f"copies {c.direction} {memory} {c.per_step:.3g}/step {size_text(c.bytes_per_step)}/step {gbps}")
    if v.copies and math.isfinite(v.during_per_step):
        parts.append(f"{v.during_per_step:.3g} collectives during copies/step")
    return " · ".join(parts)


def _ms3(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3f}" if value < 10 else f"{value:.2f}"


def stream_table(rows: Sequence[Row], modes: bool) -> list[str]:
    """One line per stream and epoch, all ranks together."""
    every = [r for r in rows if r.rank is None]
    classes = any(r.during_n for r in every)
    head = ["epoch", *(["mode"] if modes else []), "group", "op", "dtype", "size", "n", "p50 ms", "p90 ms", "p99 ms"]
    head += ["max ms", "algbw", "busbw", "time ms", "share"]
    head += ["p50 during/after/no copies"] if classes else []
    head += ["slowdown"] if modes else []
    body = []
    for r in every:
        cells = [str(r.epoch), *([r.mode] if modes else []), r.group_text, r.op, r.dtype, size_cell(r.nbytes)]
        cells += [str(r.count), _ms(r.p50_us), _ms(r.p90_us), _ms(r.p99_us), _ms(r.max_us)]
        cells += [fmt_num(r.algbw_gbps, "{:.2f}"), fmt_num(r.busbw_gbps, "{:.2f}"), fmt_num(r.total_ms, "{:.1f}")]
        cells += [fmt_num(r.step_share * 100, "{:.1f} %")]
        if classes:
            cells.append("/".join(_ms(v).replace("n/a", "-") for v in (r.during_p50_us, r.after_p50_us, r.none_p50_us)))
        if modes:
            cells.append(fmt_num(r.slowdown, "{:.2f}x"))
        body.append(tuple(cells))
    left = {i for i, h in enumerate(head) if h in ("mode", "group", "op", "dtype")}
    return [
        "per stream (all ranks; per rank in --format csv/json): time ms = time in the stream, share = of the "
        "ranks' time",
        *aligned_table(head, body, [r.epoch for r in every], left=left),
    ]


def step_table(steps: Sequence[StepRow]) -> list[str]:
    """The step view per epoch: all ranks, then each rank (up to STEP_RANKS_SHOWN ranks)."""
    shown = [s for s in steps if s.rank is None or s.rank < STEP_RANKS_SHOWN]
    if not any(math.isfinite(s.step_p50_ms) for s in shown):  # no step time: the job marks no steps
        return []  # (a rank's records all in step 0 are one step "begun", nothing measured)
    head: tuple[str, ...] = ("epoch", "rank", "steps", "steps/s", "step p50 ms", "step p99 ms", "coll ms/step")
    head += ("coll share", "copies per step", "during copies/step")
    body = []
    for s in shown:
        copies = "; ".join(
            f"{c.per_step:.3g} {c.direction} {'pinned' if c.pinned else 'pageable'} {size_cell(round(c.bytes_per_step))} "
            f"{fmt_num(c.gbps, '{:.2f}')} GB/s"
            for c in s.copies
        )
        body.append(
            (
                str(s.epoch),
                "all" if s.rank is None else str(s.rank),
                str(s.steps),
                fmt_num(s.steps_per_s, "{:.1f}"),
                fmt_num(s.step_p50_ms, "{:.3f}"),
                fmt_num(s.step_p99_ms, "{:.3f}"),
                fmt_num(s.coll_ms_per_step, "{:.3f}"),
                fmt_num(s.coll_share * 100, "{:.0f} %"),
                copies or "-",
                fmt_num(s.during_per_step, "{:.3g}") if s.copies else "-",
            )
        )
    return [
        "",
        "steps (a step starts at its first collective on a rank; step time = to the next step's start on that rank)",
        *aligned_table(head, body, [s.epoch for s in shown], left={1, 8}),
    ]


def group_table(groups: Sequence[GroupRow]) -> list[str]:
    if not groups:
        return []
    head = ("group", "size", "ranks", "streams", "records", "straggler")
    body = []
    for g in groups:
        if g.straggler is not None:
            straggler = f"rank {g.straggler} (last in {g.straggler_share * 100:.0f} % of {g.steps_compared} steps)"
        elif g.steps_compared:
            straggler = f"none clearly ({g.steps_compared} step{'' if g.steps_compared == 1 else 's'} compared)"
        else:
            straggler = "-"
        ranks = ",".join(map(str, g.ranks)) if len(g.ranks) <= 8 else f"{len(g.ranks)} ranks"
        body.append((g.group_text, str(g.size), ranks, str(g.streams), f"{g.records:,}", straggler))
    return [
        "",
        "groups (straggler: the rank whose collectives of the group took least time in a step: it arrived last)",
        *aligned_table(head, body, [0] * len(body), left={0, 2, 5}),
    ]


def missing_lines(ranks: Sequence[RankRow]) -> list[str]:
    """ "missing 0" in one line, else per rank: gaps + lost."""
    total = sum(r.missing for r in ranks)
    gaps, lost = sum(r.gaps for r in ranks), sum(r.lost for r in ranks)
    line = f"missing {total:,} collectives (iteration gaps {gaps:,} + lost by the ranks {lost:,})"
    if not total:
        return ["", line]
    head = ("rank", "host:gpu", "records", "missing", "gaps", "lost")
    body = [
        (str(r.rank), r.host, f"{r.records:,}", f"{r.missing:,}", f"{r.gaps:,}", f"{r.lost:,}")
        for r in ranks
        if r.missing
    ]
    return ["", line, *aligned_table(head, body, [0] * len(body), left={0, 1})]
