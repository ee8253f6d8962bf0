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
from tui.run.job_failure import signal_name

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
    """backend · world size · collective · shape · dtype · modes — one line."""
    shape = "x".join(map(str, s.shape)) or "?"
    modes = ", ".join(s.modes_seen) or (s.mode_in_force or "?")
    backend = s.backend or "?"
    if s.device and s.device != "cpu":
        backend = f"{backend} on {s.device}"
    workload = f"{s.collective or '?'} {shape} {s.dtype or '?'} ({s.tensor_bytes / 2**20:.1f} MiB/rank)"
    if s.config.get("source") == "monitor":  # a user's job: no synthetic tensor to describe
        workload = s.collective or "monitored job"
    return f"commtop summary: backend {backend} · world size {s.world_size} · {workload} · mode(s) {modes}"


def format_summary(snapshot: Snapshot) -> str:
    """The per-rank table printed at the end of a headless run.

    One row per rank and mode when the run saw several modes (so modes compare side by side).
    Percentiles are whole-run, by commtop's one definition (workers.wire.stats), exact up to
    RunAggregate.EXACT_CAP records per rank and mode, so they equal ``commtop report``'s; past
    that they come from a log histogram (+/-1.2 %) and are marked "~". Max is exact.
    """
    s = snapshot
    cols: tuple[str, ...] = ("rank", "host:gpu", "mode", "count", "missing", "p50 ms", "p99 ms", "max ms")
    cols += ("busbw GB/s", "copy GB/s", "drops", "state")
    rows: list[tuple[str, ...]] = []
    several = len(s.modes_seen) > 1
    for r in s.ranks:
        where = f"{r.host}:{r.gpu}" if r.host else "?"
        state = _state(r)
        parts = list(r.run_by_mode.items()) if several else [(", ".join(r.run_by_mode) or "-", r.run)]
        for i, (mode, st) in enumerate(parts):
            first = i == 0
            rows.append(
                (
                    str(r.rank) if first else "",
                    where if first else "",
                    mode,
                    str(st.count),
                    str(r.missing) if first else "",
                    _approx(st.exact) + _ms(st.p50_ms),
                    _approx(st.exact) + _ms(st.p99_ms),
                    _ms(st.max_ms),
                    _gbps(st.busbw_gbps),
                    _gbps(r.copy_run.busbw_gbps) if first else "",
                    str(r.drops) if first else "",
                    state if first else "",
                )
            )
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    left = {0, 1, 2, 11}

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(
            v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))
        )

    lines = [header_line(s), fmt(cols).rstrip(), "  ".join("-" * w for w in widths)]
    lines += [fmt(row).rstrip() for row in rows]
    if not rows:
        lines.append("(no rank reported anything)")
    extra = []
    if s.rejected_total:
        extra.append("rejected frames: " + ", ".join(f"{k} {v}" for k, v in sorted(s.rejected.items())))
    if s.lost_batches:
        extra.append(f"batches lost in transit: {s.lost_batches}")
    e = s.worst_skew
    if e is not None and e.headline:  # the others waited several typical collectives for one rank
        extra.append(
            f"worst arrival skew: rank {e.rank} arrived {e.skew_ms:.3f} ms late at iteration {e.iteration} "
            f"(the others waited {e.wait_ms:.3f} ms; typical {e.typical_ms:.3f} ms)"
        )
    if s.clock_offsets_ms:
        offsets = ", ".join(f"{h} {v:+.3f} ms" for h, v in sorted(s.clock_offsets_ms.items()) if h != s.clock_ref)
        extra.append(f"clock offsets vs {s.clock_ref} (from collective end times): {offsets}")
    lines += format_class_summary(s)
    if s.epochs is not None:
        extra.append("verdict: " + epochs_text(s.epochs, pcie_peak(s.telemetry)))
    lines += extra
    return "\n".join(lines)


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
