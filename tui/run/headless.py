"""The collector without a UI (`commtop run --headless`): ingest until told to stop, then
print a per-rank summary table. No Textual import here."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from tui.experiment.verdict import epochs_text, pcie_peak
from tui.ingest.interfaces import Sink, Source
from tui.ingest.loop import IngestLoop
from tui.model.run_model import RunModel
from tui.model.snapshot import RankView, Snapshot
from tui.model.stats import RunAggregate
from tui.report.views_text import step_line
from tui.run.summary_views import job_workload, stream_lines
from workers.wire.endings import signal_name

#: At the end, drain until one poll this long brings nothing, for at most DRAIN_MAX_S.
DRAIN_QUIET_S = 0.1
DRAIN_MAX_S = 2.0


def run_headless(
    source: Source,
    model: RunModel,
    stop_event: threading.Event,
    until: Callable[[], bool] = lambda: False,
    sinks: Iterable[Sink] = (),
    *,
    check_s: float = 0.1,
) -> Snapshot:
    """Ingest on the caller's thread until ``stop_event`` is set or ``until()`` is true;
    then drain what is still queued and return the final snapshot."""
    loop = IngestLoop(source, model, sinks=sinks)
    next_check = 0.0
    while not stop_event.is_set():
        loop.step(0.02)
        now = time.monotonic()
        if now >= next_check:
            next_check = now + check_s
            if until():
                break
    # What arrived before the end still counts: frames can still be in ZeroMQ's I/O thread or
    # the ipc pipe when the stop comes, so drain until the source is quiet, within a bound (a
    # publisher that never stops must not hold the exit).
    deadline = time.monotonic() + DRAIN_MAX_S
    while loop.step(DRAIN_QUIET_S) and time.monotonic() < deadline:
        pass
    for line in loop.errors:
        print(f"commtop: {line}")
    return loop.snapshot(fresh_run_stats=True)


def _ms(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3f}" if value < 10 else f"{value:.2f}"


def _approx(exact: bool) -> str:
    return "" if exact else "~"


def _gbps(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.2f}"


def header_line(s: Snapshot) -> str:
    """backend · world size · collective · shape · dtype · modes — one line; a user's job: its
    script, steps/s, groups and ops (modes only where it declared a mode knob)."""
    shape = "x".join(map(str, s.shape)) or "?"
    modes = ", ".join(s.modes_seen) or (s.mode_in_force or "?")
    backend = s.backend or "?"
    if s.device and s.device != "cpu":
        backend = f"{backend} on {s.device}"
    workload = f"{s.collective or '?'} {shape} {s.dtype or '?'} ({s.tensor_bytes / 2**20:.1f} MiB/rank)"
    if s.job.is_job:  # a user's job: no synthetic tensor to describe
        workload = job_workload(s)
    mode_text = f" · mode(s) {modes}" if s.job.has_modes else ""
    return f"commtop summary: backend {backend} · world size {s.world_size} · {workload}{mode_text}"


def format_summary(snapshot: Snapshot) -> str:
    """The per-rank table printed at the end of a headless run.

    One row per rank and mode when the run saw several modes (so modes compare side by side).
    Percentiles are whole-run, by commtop's one definition (workers.wire.stats), exact up to
    RunAggregate.EXACT_CAP records per rank and mode, so they equal ``commtop report``'s; past
    that they come from a log histogram (+/-1.2 %) and are marked "~". Max is exact.

    ``missing`` = iteration gaps + the collectives a rank says it never recorded (``lost``, a
    column of its own where any rank lost some). A job without modes has no mode column. After
    the tables: the step line and one line per stream.
    """
    s = snapshot
    cols = ["rank", "host:gpu", "mode", "count", "missing", "lost", "p50 ms", "p99 ms", "max ms"]
    cols += ["busbw GB/s", "copy GB/s", "drops", "state"]
    if not s.job.has_modes:
        cols.remove("mode")
    if not s.lost:
        cols.remove("lost")
    rows: list[tuple[str, ...]] = []
    several = len(s.modes_seen) > 1 and s.job.has_modes
    for r in s.ranks:
        where = f"{r.host}:{r.gpu}" if r.host else "?"
        state = _state(r)
        parts = list(r.run_by_mode.items()) if several else [(", ".join(r.run_by_mode) or "-", r.run)]
        for i, (mode, st) in enumerate(parts):
            first = i == 0
            cells = {
                "rank": str(r.rank) if first else "",
                "host:gpu": where if first else "",
                "mode": mode,
                "count": str(st.count),
                "missing": str(r.missing) if first else "",
                "lost": str(r.lost) if first else "",
                "p50 ms": _approx(st.exact) + _ms(st.p50_ms),
                "p99 ms": _approx(st.exact) + _ms(st.p99_ms),
                "max ms": _ms(st.max_ms),
                "busbw GB/s": _gbps(st.busbw_gbps),
                "copy GB/s": _gbps(r.copy_run.busbw_gbps) if first else "",
                "drops": str(r.drops) if first else "",
                "state": state if first else "",
            }
            rows.append(tuple(cells[c] for c in cols))
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    left = {i for i, c in enumerate(cols) if c in ("rank", "host:gpu", "mode", "state")}

    def fmt(row: tuple[str, ...] | list[str]) -> str:
        return "  ".join(
            v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))
        )

    if not rows:  # nothing to describe: not a header of question marks over an empty table
        return "commtop summary: no rank reported anything"
    lines = [header_line(s), fmt(cols).rstrip(), "  ".join("-" * w for w in widths)]
    lines += [fmt(row).rstrip() for row in rows]
    if any(not st.exact for r in s.ranks for st in (r.run, *r.run_by_mode.values())):
        lines.append(approx_footnote())
    extra = []
    if s.rejected_total:
        extra.append("rejected frames: " + ", ".join(f"{k} {v}" for k, v in sorted(s.rejected.items())))
    if s.lost_batches:
        extra.append(f"batches lost in transit: {s.lost_batches}")
    if s.job.is_job and s.backend in ("", "unknown") and not any(r.count for r in s.ranks):
        extra.append("no rank made a process group (torch.distributed): the job issued no collective to time")
    e = s.worst_skew
    if e is not None and e.headline:  # the others waited several typical collectives for one rank
        extra.append(
            f"worst arrival skew: rank {e.rank} arrived {e.skew_ms:.3f} ms late at iteration {e.iteration} "
            f"(the others waited {e.wait_ms:.3f} ms; typical {e.typical_ms:.3f} ms)"
        )
    if s.interleaved:
        extra.append(
            "arrival skew: not compared across ranks: they issue their collectives in different orders "
            "(several threads); per process group: commtop report"
        )
    if s.clock_offsets_ms:
        offsets = ", ".join(f"{h} {v:+.3f} ms" for h, v in sorted(s.clock_offsets_ms.items()) if h != s.clock_ref)
        extra.append(f"clock offsets vs {s.clock_ref} (from collective end times): {offsets}")
    lines += format_class_summary(s)
    if s.epochs is not None and s.job.has_modes:
        extra.append("verdict: " + epochs_text(s.epochs, pcie_peak(s.telemetry)))
    lines += extra
    steps = step_line(s.steps)
    if steps:
        lines += ["", steps]
    if s.job.is_job or len(s.streams) > 1:  # the synthetic loop is one stream: its table says it all
        lines += stream_lines(s.streams)
    return "\n".join(lines)


def approx_footnote() -> str:
    """What the "~" before a percentile means (one line under the table)."""
    return (
        f"~ p50/p99 from a log histogram, within ±1.2 %: past {RunAggregate.EXACT_CAP:,} collectives per rank "
        "and mode only the histogram is kept (commtop report reads every record: exact)"
    )


def format_class_summary(s: Snapshot) -> list[str]:
    """Per rank and overlap class (during copies / after copies / no copies): n, p50, p99."""
    rows = [
        (str(r.rank), name, str(st.count), _ms(st.p50_ms), _ms(st.p99_ms))
        + ((f"{r.overlapped * 100:.0f} %" if math.isfinite(r.overlapped) else "-") if name == "during copies" else "",)
        for r in s.ranks
        for name, st in r.run_by_class.items()
    ]
    if not rows or all(name == "no copies" for _, name, *_ in rows):
        return []
    cols = ("rank", "overlap class", "count", "p50 ms", "p99 ms", "overlapped")
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(
            v.ljust(w) if i in (0, 1) else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))
        )

    return ["", fmt(cols).rstrip(), "  ".join("-" * w for w in widths), *(fmt(r).rstrip() for r in rows)]


def _state(r: RankView) -> str:
    if r.state == "exited":
        name = signal_name(r.exit_code) if r.exit_code is not None else ""
        return f"killed by {name}" if name else f"exited ({r.exit_code})"
    return r.state
