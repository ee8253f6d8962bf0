"""The run header: what runs (backend, world, collective, sizes), what mode is in force,
and how healthy the stream is (rate, drops, rejected, ranks, recording, host load)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.widget import Widget

from tui.ingest.interfaces import ControlView, RecordingStatus
from tui.model.in_force import settings_wire
from tui.model.snapshot import SkewEvent, Snapshot
from tui.model.snapshot_builder import RECENT_SKEW_S
from tui.model.streams import OTHER, groups_and_ops, listed
from tui.report.views_text import size_cell
from tui.view.widgets.palette import (
    ACCENT,
    EXITED,
    LIVE,
    MODE_COLORS,
    MUTED,
    TEXT,
    WARN,
    fmt_bytes,
    fmt_duration,
    style,
)
from workers.wire.settings import Settings

#: Groups the header names before "+N more" (a job may make hundreds).
HEADER_GROUPS = 6


def _kv(text: Text, key: str, value: str, color: str = TEXT, *, bold: bool = False) -> None:
    text.append(f"{key} ", style=style(MUTED))
    text.append(value, style=style(color, bold=bold))
    text.append("  ")


def _settings_text(settings: Settings | None, mode: str, snap: Snapshot | None = None) -> str:
    if settings is None:  # the records told the mode, no hello the rest yet
        return "? copies ×1 ? pinned" if mode else ""
    cpu = snap is not None and snap.device in ("", "cpu")
    host = "pinned" if settings.pinned and not cpu else "pageable"  # a CPU has no pinned memory
    knobs = " ".join(f"{k}={v}" for k, v in sorted(settings.knobs.items()))
    if snap is not None and snap.config.get("source") == "monitor":
        # a user's job: the loop's copy settings mean nothing there; its copy records count
        seen = sum(r.copies for r in snap.ranks)
        parts = [f"{seen:,} copies" if seen else "no copies", f"knobs {knobs}" if knobs else ""]
        return "  ".join(p for p in parts if p)
    return f"{settings.copies} copies ×{settings.copy_scale:g} {settings.direction} {host}" + (
        f"  {knobs}" if knobs else ""
    )


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """What a settings change does, in the words of the keys: "copies 5 → 6", "pinned →
    pageable", "size ×1 → ×2", "mode overlap → sync"; "" when nothing differs."""
    parts = []
    for key, new in after.items():
        old = before.get(key)
        if old == new or key == "knobs" and not new:
            continue
        if key == "pinned":
            parts.append(f"{'pinned' if old else 'pageable'} → {'pinned' if new else 'pageable'}")
        elif key == "copy_scale":
            parts.append(f"size ×{_fmt_value(old)} → ×{_fmt_value(new)}")
        elif key == "knobs":
            old_k = dict(old or {})
            parts += [f"{k} {old_k.get(k, '?')} → {v}" for k, v in dict(new).items() if old_k.get(k) != v]
        else:
            parts.append(f"{key} {_fmt_value(old) if old is not None else '?'} → {_fmt_value(new)}")
    return ", ".join(parts)


def skew_text(snap: Snapshot, compact: bool = False) -> str:
    """The largest arrival skew of the last seconds, when the others waited several typical
    collectives (the current state, not the worst ever: that is :func:`worst_skew_text`)."""
    e = snap.recent_skew
    if e is None or not e.headline:
        return ""
    if compact:
        return f"⚠ straggler: rank {e.rank} {e.skew_ms:.1f} ms late at {_at(e, snap, compact=True)}"
    return (
        f"⚠ straggler (last {RECENT_SKEW_S:g} s): rank {e.rank} arrived {e.skew_ms:.1f} ms late at "
        f"{_at(e, snap)} (the others waited {e.wait_ms:.1f} ms; typical {e.typical_ms:.2f} ms)"
    )


def _at(e: SkewEvent, snap: Snapshot, compact: bool = False) -> str:
    """Where a skew was: ``iteration 455`` (the records' iteration, as the report and its CSV
    say), or, found on a drawn stream, ``call 228 of all_reduce 1KiB``: that stream's calls,
    counted from 1, its size as the stream table writes it."""
    if e.stream < 0:
        return f"it {e.iteration}" if compact else f"iteration {e.iteration}"
    view = next((v for v in snap.streams if v.index == e.stream), None)
    call = e.iteration + 1  # the history's columns count from 0
    return f"call {call} of {view.op} {size_cell(view.nbytes)}" if view else f"call {call} of a stream"


def worst_skew_text(snap: Snapshot) -> str:
    """The run's worst arrival skew, as a detail beside the current state ("" when it is the
    current one, or was never worth a headline)."""
    e, now = snap.worst_skew, snap.recent_skew
    if e is None or not e.headline or (now is not None and now.headline and now.iteration == e.iteration):
        return ""
    return f"run's worst: rank {e.rank} {e.skew_ms:.1f} ms late at {_at(e, snap)}"


def clock_text(snap: Snapshot, most: int = 3) -> str:
    """Estimated clock offsets of the other hosts (from collective end times), largest first."""
    others = sorted(
        ((h, v) for h, v in snap.clock_offsets_ms.items() if h != snap.clock_ref), key=lambda hv: -abs(hv[1])
    )
    if not others:
        return ""
    shown = ", ".join(f"{h} {v:+.2f} ms" for h, v in others[:most])
    more = f" (+{len(others) - most} hosts)" if len(others) > most else ""
    return f"clocks vs {snap.clock_ref}: {shown}{more}"


#: What the header says before any rank reported: live, and in a replay (still going, ended).
WAITING = "waiting for ranks to connect…"
REPLAY_WAITING = "replaying: no rank has reported yet…"
REPLAY_EMPTY = "this recording holds no rank data: no rank reported before it ended"


def header_text(
    snap: Snapshot | None,
    control: ControlView | None = None,
    recording: RecordingStatus | None = None,
    title: str = "commtop",
    width: int = 0,
    waiting: str = WAITING,
) -> Text:
    """Three lines; pure (tested without an app). When a line is wider than ``width`` the
    header is condensed (fewer words, the same facts first) instead of cut at the edge.
    ``waiting``: the line shown until a rank reports."""
    full = _header_text(snap, control, recording, title, compact=False, waiting=waiting)
    if width <= 0 or all(len(line) <= width for line in full.plain.split("\n")):
        return full
    return _header_text(snap, control, recording, title, compact=True, waiting=waiting)


def _short_title(title: str, most: int = 34) -> str:
    """ "commtop replay · h200-nccl-1gpu…modes.commtop": the start and the end survive."""
    if len(title) <= most:
        return title
    keep = most - 1
    return title[: keep - keep // 3] + "…" + title[-(keep // 3) :]


def _header_text(
    snap: Snapshot | None,
    control: ControlView | None,
    recording: RecordingStatus | None,
    title: str,
    compact: bool,
    waiting: str = WAITING,
) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    shown_title = _short_title(title) if compact else title
    t.append(f"{shown_title}  ", style=style(ACCENT, bold=True))
    if snap is None or not snap.ranks:
        t.append(waiting, style=style(MUTED))
        t.append("\n\n")
        if snap is not None:
            _health(t, snap, recording, control, compact)
        return t
    backend = snap.backend or "?"
    if backend.startswith("gloo") and "cpu" not in backend:
        backend = f"{backend}/cpu" if snap.device in ("", "cpu") else backend
    device = "" if snap.device in ("", "cpu") else f" on {snap.device}"
    if compact:  # "nccl H200": the value says what it is
        short = backend + device.replace(" on NVIDIA", "").replace(" on", "")
        if short not in shown_title:  # `commtop run`'s title already says "· gloo/cpu"
            t.append(short, style=style(WARN if "cpu" in backend else TEXT, bold=True))
            t.append("  ")
    else:
        _kv(t, "backend", backend + device, WARN if "cpu" in backend else TEXT, bold=True)
    _kv(t, "world", str(snap.world_size), bold=True)
    if snap.job.is_job:  # a user's job: its script (and how it is captured), not a tensor shape
        _kv(t, "job", snap.job.script, bold=True)
        if snap.job.capture and not compact:
            t.append(f"({snap.job.capture})  ", style=style(MUTED))
    else:
        shape = "x".join(map(str, snap.shape)) or "?"
        _kv(t, snap.collective or "?", f"{shape} {snap.dtype}".strip(), bold=True)
    if snap.tensor_bytes and not compact:
        _kv(t, "tensor", fmt_bytes(snap.tensor_bytes))
    if snap.started_ns:
        _kv(t, "up", fmt_duration((snap.now_ns - snap.started_ns) / 1e9))
    clocks = clock_text(snap) if not compact else ""
    if clocks:
        t.append(clocks, style=style(MUTED))
    t.append("\n")

    # The settings' mode (the records' mode once any came), else the records' alone.
    mode = snap.settings.mode if snap.settings is not None else snap.mode_in_force or "?"
    in_force = settings_wire(snap.settings, snap.mode_in_force)
    if snap.job.has_modes:
        t.append("mode ", style=style(MUTED))
        t.append(f" {mode} ", style=style("#000000", MODE_COLORS.get(mode, TEXT), bold=True))
        t.append(f"  {_settings_text(snap.settings, snap.mode_in_force, snap)}", style=style(TEXT))
        t.append(f"  epoch {snap.epoch_in_force}", style=style(MUTED))
    if snap.job.is_job:
        t.append(("  " if snap.job.has_modes else "") + job_streams_text(snap), style=style(TEXT))
    pending, apply_at = snap.pending_epoch, snap.apply_at
    requested = control.requested if control is not None else None
    if requested is not None and pending < 0:
        wanted = settings_change(in_force, requested.as_dict())
        if wanted:
            t.append(f"  requested {wanted} (not yet in force)", style=style(WARN))
    if pending >= 0:
        at = f" at iteration {apply_at}" if apply_at >= 0 else ""
        target = requested if requested is not None else snap.pending_settings
        change = settings_change(in_force, target.as_dict()) if target is not None else ""
        what = change or f"to epoch {pending}"
        if compact:  # "⇢ mode overlap → none at it 640"
            t.append(f"  ⇢ {what}{at.replace('iteration', 'it')}", style=style(WARN, bold=True))
        else:
            t.append(f"  ⇢ switching {what}{at}", style=style(WARN, bold=True))
    if control and control.note and not compact:
        t.append(f"  {control.note}", style=style(MUTED))
    skew = skew_text(snap, compact)
    if skew:
        t.append(f"  {skew}", style=style(WARN, bold=True))
    worst = worst_skew_text(snap) if not compact else ""
    if worst:
        t.append(f"  {'· ' if skew else ''}{worst}", style=style(MUTED))
    t.append("\n")
    _health(t, snap, recording, control, compact)
    return t


def job_streams_text(snap: Snapshot) -> str:
    """A job's groups and ops: "groups 0:default_pg (4), 1 (2) · ops all_reduce, all_to_all · 6 streams",
    and where the ranks order their collectives differently (threads) that skew and straggler
    need one stream drawn."""
    groups, ops = groups_and_ops(snap.streams)
    if not groups:
        return "no collectives yet"
    named = sum(1 for s in snap.streams if s.index != OTHER)
    text = f"groups {listed(groups, HEADER_GROUPS)} · ops {', '.join(ops)} · {named} stream{'s' if named != 1 else ''}"
    if snap.interleaved and snap.selected_stream < 0:  # no skew nor straggler for every collective
        text += " · ranks differ in order: skew per stream (f)"
    return text


def _health(
    t: Text,
    snap: Snapshot,
    recording: RecordingStatus | None,
    control: ControlView | None = None,
    compact: bool = False,
) -> None:
    total = max(snap.world_size, len(snap.ranks))
    ended = bool(total) and len(snap.ranks) == total and all(r.state == "exited" for r in snap.ranks)
    if snap.job.is_job and (math.isfinite(snap.step_rate) or ended):  # a job's pace is its steps
        # a rate of the newest seconds: once every rank exited it is no rate of anything now
        _kv(t, "steps/s", "-" if ended else f"{snap.step_rate:,.1f}", bold=True)
    else:
        rate = f"{snap.iter_rate:,.0f}" if math.isfinite(snap.iter_rate) and not ended else "-"
        _kv(t, "it/s", rate, bold=True)
    live = snap.live_ranks
    stalled = sum(1 for r in snap.ranks if r.state == "stalled")  # alive (heartbeats), no collective lately
    if ended:
        _kv(t, "ranks", f"{total} exited", TEXT, bold=True)  # the job ended: "0/2" read as a fault
    elif stalled:
        _kv(t, "ranks", f"{live + stalled}/{total} ({stalled} stalled)", WARN, bold=True)
    else:
        _kv(t, "ranks", f"{live}/{total}", LIVE if live == total and total else WARN, bold=True)
    if snap.drops or not compact:  # condensed: a zero is not news
        _kv(t, "drops", f"{snap.drops:,}", WARN if snap.drops else TEXT)
    if snap.lost:  # collectives the ranks issued and never recorded (their own count)
        _kv(t, "lost", f"{snap.lost:,}", WARN)
    by_collector = control.rejected if control is not None else 0
    rejected = snap.rejected_total + snap.worker_rejected + by_collector
    why = dict(snap.rejected)
    if snap.worker_rejected:
        why["by workers"] = snap.worker_rejected
    if by_collector:
        why["control requests"] = by_collector
    detail = " (" + ", ".join(f"{k} {v}" for k, v in sorted(why.items())) + ")" if rejected else ""
    if rejected or not compact:
        _kv(t, "rejected", f"{rejected:,}{detail}", EXITED if rejected else TEXT)
    if recording is not None:
        if recording.error:
            t.append(f"REC ✗ {recording.error}  ", style=style(EXITED, bold=True))
        elif recording.active:
            t.append("● REC ", style=style(EXITED, bold=True))
            t.append(f"{fmt_bytes(recording.bytes_written)} {fmt_duration(recording.elapsed_s)}  ", style=style(TEXT))
        elif not compact:
            t.append("rec off  ", style=style(MUTED))
    host_line = getattr(snap.telemetry, "host_line", None)
    if callable(host_line):
        try:
            t.append(str(host_line(short=compact)), style=style(MUTED))
        except Exception:
            pass


class RunHeader(Widget):
    """Three lines at the top; updated by the app from the latest snapshot."""

    DEFAULT_CSS = "RunHeader { height: 3; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, title: str = "commtop", *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title_text = title
        self._text = header_text(None, title=title)
        self._last: tuple[Snapshot | None, ControlView | None, RecordingStatus | None] = (None, None, None)
        self._key: tuple[ControlView | None, RecordingStatus | None, int] | None = None  # what else the text read
        self._waiting = WAITING

    def set_waiting(self, text: str) -> None:
        """The line shown until a rank reports (a replay says whether it is still going)."""
        if text != self._waiting:
            self._waiting = text
            self._key = None
            self.show(*self._last)

    def on_resize(self) -> None:
        self.show(*self._last)

    def show(self, snap: Snapshot | None, control: ControlView | None, recording: RecordingStatus | None) -> None:
        """Rebuild the three lines, unless only the history moved since the last ones: between two
        text ticks the screen's snapshots keep the last full one's ranks (the same tuple) and all
        the header reads but the up time and the host line, which then move at the 5 Hz of the
        rest of the text (tui.model.snapshot_builder.TEXT_EVERY_S). At 64 ranks the header was
        ~8 % of the UI thread, rebuilt 15 times a second."""
        width = self.content_size.width
        last, key = self._last[0], (control, recording, width)
        if snap is not None and last is not None and snap.ranks and snap.ranks is last.ranks and key == self._key:
            self._last = (snap, control, recording)
            return
        self._last, self._key = (snap, control, recording), key
        text = header_text(snap, control, recording, self.title_text, width, self._waiting)
        if text.plain != self._text.plain or text.spans != self._text.spans:
            self._text = text
            self.refresh()

    def render(self) -> Text:
        return self._text
