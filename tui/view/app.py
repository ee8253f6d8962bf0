"""The commtop terminal app: header, one grid of rank rows, the links panel, status, footer.

The app never ingests: an :class:`~tui.ingest.loop.IngestLoop` thread drains the source into the
model and hands a frozen Snapshot to :meth:`CommtopApp._from_ingest`, which posts ONE
``SnapshotReady`` message (coalesced: never more than one in the queue), so a flood of
records cannot starve the keyboard. Widgets are updated in one ``batch_update()``.

Build it with :func:`tui.view.build.build_app` (from a run's session, or from a connection for
tests), or directly with ``CommtopApp(source, model, ...)``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.reactive import var
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from tui.experiment.ab_experiment import ABSlot
from tui.experiment.verdict import pcie_peak, verdict_text
from tui.ingest.interfaces import (
    ControllerLike,
    ControlView,
    ProcessWatch,
    RecorderLike,
    RecordingStatus,
    ReplayControls,
    Sink,
    Source,
)
from tui.ingest.loop import IngestLoop
from tui.model.changeable import Changeable
from tui.model.run_model import RunModel
from tui.model.snapshot import Snapshot
from tui.model.streams import NEXT_STREAM
from tui.view import setting_keys
from tui.view.gc_tuning import settle_garbage_collector
from tui.view.keys import KEYS, bindings
from tui.view.messages import IngestError, SnapshotReady
from tui.view.signal_stop import SignalStop
from tui.view.widgets.connect import ConnectPanel
from tui.view.widgets.covered_box import CoveredBox
from tui.view.widgets.header import REPLAY_EMPTY, REPLAY_WAITING, RunHeader, settings_change
from tui.view.widgets.help import HelpScreen, key_name
from tui.view.widgets.job_log import JobLogScreen, job_log_of
from tui.view.widgets.links import LinksPanel, RankGpu
from tui.view.widgets.missing_ranks import MissingRanks
from tui.view.widgets.rank_grid import GridHeader, RankGrid
from tui.view.widgets.status import ReplayBar, StatusLine
from tui.view.widgets.streams import StreamPanel
from tui.view.widgets.verdict import VerdictLine, replay_idle_text
from workers.wire.protocol import DIRECTIONS, MODES
from workers.wire.settings import COPY_SCALES, MAX_COPIES, Settings

#: How often the app reads the controller, recorder, job and replay position (UI thread).
SIDE_POLL_S = 0.25
REPLAY_SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

_W = TypeVar("_W", bound=Widget)

_CONTROL_ACTIONS = {"cycle_mode", "pick_mode", "copies", "cycle_scale", "toggle_pinned", "toggle_direction"}
_REPLAY_ACTIONS = {"replay_pause", "replay_speed", "replay_seek", "replay_jump"}


class CommtopApp(SignalStop, App[None]):
    """Live (or replayed) view of a commtop run.

    Args:
        source: where messages come from (``LiveSource``, ``ReplaySource``); None shows only
            what is given to :meth:`show_snapshot` (snapshot tests).
        model: the RunModel the ingest thread fills (a fresh one by default).
        sinks: get every accepted message (recorder, control server).
        controller: live settings (keys o, 1-4, c, C, s, h, d); optional.
        recorder: key r starts/stops it; its status is in the header; optional.
        process_watch: the torchrun job (exit code, error lines) for the status line.
        title: first word of the header.
        hint: status line text while nothing is wrong (default: where we listen).
        clock: ns clock for the ingest thread (default: the source's ``now_ns`` or wall time).
        interval_s: snapshot period (0.08 s = 12.5 Hz redraws at most).
        owns_source: close the source when the app exits.
        links: show the telemetry links panel (snapshot tests turn it off: another module).
    """

    CSS_PATH = "app.tcss"
    TITLE = "commtop"
    ENABLE_COMMAND_PALETTE = True

    BINDINGS = bindings()

    whole_run_stats: var[bool] = var(True, init=False)
    """Whether the ranks' whole-run numbers are on screen (the rows view, with rows taller than
    one line): the app asks the ingest loop to refresh them only then."""

    def __init__(
        self,
        source: Source | None = None,
        model: RunModel | None = None,
        *,
        sinks: Iterable[Sink] = (),
        controller: ControllerLike | None = None,
        recorder: RecorderLike | None = None,
        process_watch: ProcessWatch | None = None,
        title: str = "commtop",
        hint: str = "",
        clock: Callable[[], int] | None = None,
        interval_s: float = 0.08,
        owns_source: bool = False,
        links: bool = True,
        connect: Sequence[str] = (),
        tune_gc: bool = False,
    ) -> None:
        super().__init__()
        self.tune_gc = tune_gc  # the CLI's process: tui.view.gc_tuning once mounted (not in tests)
        self.source = source
        self.model = model if model is not None else RunModel()
        self.sinks = list(sinks)
        self.controller = controller
        self.recorder = recorder
        self.process_watch = process_watch
        self.run_title = title
        endpoint = getattr(source, "endpoint", "")
        self.hint = hint or (f"listening on {endpoint}" if endpoint else "")
        self.clock = clock
        self.interval_s = interval_s
        self.owns_source = owns_source
        self.with_links = links
        #: How to reach this run (``commtop watch``): shown until the first rank arrives, and on i.
        self.connect_lines = list(connect)
        self._connect_auto = bool(connect)  # still shown automatically (no rank has arrived yet)
        self.replay: ReplayControls | None = source if isinstance(source, ReplayControls) else None
        live = source is not None and self.replay is None
        self._missing = MissingRanks(watch=bool(connect)) if live else None  # ranks that never said hello
        known = getattr(source, "epoch_settings", None)  # a replay knows every epoch's settings
        if isinstance(known, dict):
            self.model.learn_epoch_settings(known)
        self.ingest: IngestLoop | None = None
        self.snapshot: Snapshot | None = None
        #: Snapshots applied to the widgets so far (tests wait on it).
        self.applied = 0
        self._latest: Snapshot | None = None
        self._posted = threading.Event()
        self._errors: list[str] = []
        self._control: ControlView | None = None
        self.refused = setting_keys.RefusedLine()  # a refused change's reason, for a while
        self._recording: RecordingStatus | None = None
        #: The A/B experiment slot (key a); a sink, so it sees every message.
        self.ab = ABSlot()
        self.sinks.append(self.ab)
        #: The app's widgets by type, found once (a query walks the DOM: ~0.3 ms a frame).
        self._found: dict[type[Widget], Widget | None] = {}
        self._streams_to_choose = False  # two streams or more: the f key is in the footer

    # ----------------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        # The lines above and below the grid sit in containers of their own: Textual's partial
        # repaint renders every widget whose container overlaps what changed, so as children of
        # the screen they were all rendered again at every frame for the grid's lines alone.
        # The panels below the grid (the links' lines move with every frame too) are apart from
        # the status line and the footer, which rarely change.
        header = GridHeader(id="grid-header")
        with CoveredBox(id="top"):
            yield RunHeader(self.run_title, id="header")
            yield VerdictLine(id="verdict")
            yield header
        if self.connect_lines:
            yield ConnectPanel(self.connect_lines, id="connect")
        yield RankGrid(header, id="grid")
        with CoveredBox(id="bottom"):
            with Vertical(id="panels"):
                yield StreamPanel(id="streams")
                if self.with_links:
                    yield LinksPanel(id="links")
            with Vertical(id="bars"):
                bar = ReplayBar(id="replay")
                bar.display = self.replay is not None
                yield bar
                yield StatusLine(id="status")
                yield Footer()

    def on_mount(self) -> None:
        self.catch_sigterm()
        self._one(StatusLine).show([], self.hint)
        if self.source is not None:
            self.ingest = IngestLoop(
                self.source,
                self.model,
                sinks=self.sinks,
                on_snapshot=self._from_ingest,
                interval_s=self.interval_s,
                clock=self.clock,
                on_error=self._from_ingest_error,
            )
            if not self.whole_run_stats:
                self.ingest.request_whole_run_stats(False)
            self.ingest.start()
        self.set_interval(SIDE_POLL_S, self._side_poll)
        self._side_poll()
        if self.tune_gc:
            settle_garbage_collector()

    def on_unmount(self) -> None:
        self.release_sigterm()
        if self.ingest is not None:
            self.ingest.stop()
            self.ingest.join(2.0)
        if self.owns_source and self.source is not None:
            self.source.close()

    # ----------------------------------------------------------------------- data in

    def _from_ingest(self, snap: Snapshot) -> None:
        """Ingest thread: keep the newest snapshot; post a message only if none is queued."""
        self._latest = snap
        if not self._posted.is_set():
            self._posted.set()
            self.post_message(SnapshotReady(snap))

    def _from_ingest_error(self, line: str) -> None:
        """Ingest thread: a sink/source/callback failed (already de-duplicated there)."""
        self.post_message(IngestError(line))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._posted.clear()
        try:
            self.show_snapshot(self._latest or message.snapshot)
        except NoMatches:  # delivered while the app shuts down, after its widgets were removed
            return
        self._paint_now()

    def _paint_now(self) -> None:
        """Paint what the snapshot changed in this wake-up of the UI thread. Textual paints on its
        screen-update timer, which the next idle check starts: up to 1/60 s later, in a second
        wake-up. e2e_latency on the VM, 2 alternating pairs: record to screen p50 71-72 -> 68-69
        ms, p99 131 -> 126-128 ms; the UI thread's CPU did not measurably change (render_scale).
        Textual is pinned (pyproject): this calls the screen's own update, which clears what it
        painted, so the idle check that follows finds nothing left and starts no timer (it paints
        only the current screen, outside a batch update, as on its timer)."""
        self.screen._on_timer_update()

    def on_ingest_error(self, message: IngestError) -> None:
        self._errors = (self._errors + [message.text])[-10:]
        self._update_status()

    def show_snapshot(self, snap: Snapshot) -> None:
        """Apply one snapshot to every widget (UI thread)."""
        self.snapshot = snap
        with self.batch_update():
            if self._connect_auto and snap.ranks:  # the first rank found its way: the panel may go
                self._connect_auto = False
                self._show_connect(False)
            grid = self._one(RankGrid)
            grid.show(snap)
            self._want_run_stats(grid)
            self._one(RunHeader).show(snap, self._control, self._recording)
            if self._one(StreamPanel).show(snap) != self._streams_to_choose:  # f appears with a second stream
                self._streams_to_choose = not self._streams_to_choose
                self.refresh_bindings()
            self._show_verdict()
            links = self._links()
            if links is not None and snap.telemetry is not None:
                try:
                    links.update_snapshot(
                        snap.telemetry,
                        grid.time_axis,
                        [RankGpu(f"r{r.rank}", r.host, r.gpu_uuid, r.copy_gbps) for r in snap.ranks if r.gpu_uuid],
                        max_lines=self._links_budget(snap, links),
                    )
                except Exception as exc:  # the panel must not take the app down
                    self._note_error(f"links panel: {type(exc).__name__}: {exc}")
        self.applied += 1

    def _links_budget(self, snap: Snapshot, links: LinksPanel) -> int:
        """Lines the links panel may use: what is left when the rank rows have what they need
        (three lines a rank, so every rank shows its numbers; at most half when ranks are many)."""
        grid = self._one(RankGrid)
        body = grid.size.height + links.size.height  # the two share what header, bars and footer leave
        n = max(1, len(snap.ranks))
        need = min(3 * n, max(min(n, body - 4), body // 2))
        return max(1, body - need - 1)  # - 1: the panel's top border

    def _links(self) -> LinksPanel | None:
        if LinksPanel not in self._found:
            found = self.query(LinksPanel)
            self._found[LinksPanel] = found.first() if found else None
        panel = self._found[LinksPanel]
        return panel if isinstance(panel, LinksPanel) and panel.is_attached else None

    def _one(self, kind: type[_W]) -> _W:
        """``query_one(kind)``, remembered while the widget stays attached (NoMatches after
        the app's widgets were removed, as query_one raises)."""
        widget = self._found.get(kind)
        if not isinstance(widget, kind) or not widget.is_attached:
            widget = self._found[kind] = self.query_one(kind)
        return widget

    def _side_poll(self) -> None:
        """Controller / recorder / job / replay state: cheap reads on the UI thread."""
        try:
            self._poll_side_state()
        except NoMatches:  # a tick while the app shuts down, after its widgets were removed
            pass

    def _poll_side_state(self) -> None:
        changed = False
        if self.controller is not None:
            try:
                view = self.controller.view()
            except Exception as exc:
                view = None
                self._note_error(f"control: {exc}")
            changed |= view != self._control
            if (view.can_change if view else None) != self._can():
                self.call_later(self.refresh_bindings)  # footer: only the keys this run offers
            self._control = view
        if self.recorder is not None:
            try:
                rec = self.recorder.status()
            except Exception as exc:
                rec = RecordingStatus(active=False, error=str(exc))
            changed |= rec != self._recording
            self._recording = rec
        if changed:
            self._one(RunHeader).show(self.snapshot, self._control, self._recording)
        if self.replay is not None:
            position = self.replay.position()
            self._one(ReplayBar).show(position)
            self._one(RunHeader).set_waiting(REPLAY_EMPTY if position.finished else REPLAY_WAITING)
        self.ab.tick()
        self._show_verdict()
        self._update_status()

    def _update_status(self) -> None:
        lines = self._missing.lines(self.snapshot) if self._missing is not None else []
        hint = self.hint
        watch = self.process_watch
        if watch is not None:
            code = watch.exit_code()
            if code is None:
                # A rank that crashed while torchrun still tears the others down.
                errors = [ln for ln in watch.lines()[-50:] if "Error" in ln or "Traceback" in ln]
                if errors:
                    lines.append(f"worker: {errors[-1]}")
            elif code != 0:
                tail = getattr(watch, "error_lines", None)
                errors = list(tail() if callable(tail) else watch.lines()[-3:])
                lines.append(f"job exited with code {code}" + (": " + errors[-1] if errors else ""))
                lines += errors[-3:-1]
            else:
                hint = "job finished (exit code 0) · q to quit"
        lines += self._errors[-2:]
        lines += self.refused.lines()
        self._one(StatusLine).show(lines, hint)

    def _note_error(self, line: str) -> None:
        if not self._errors or self._errors[-1] != line:
            self._errors = (self._errors + [line])[-10:]

    # ----------------------------------------------------------------------- keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _CONTROL_ACTIONS or action == "ab":  # only what this run can change
            return self.controller is not None and not setting_keys.refusal(action, parameters, self._can())
        if action in _REPLAY_ACTIONS:
            return self.replay is not None
        if action == "toggle_record":
            return self.recorder is not None
        if action == "toggle_connect":
            return bool(self.connect_lines)
        if action == "next_stream":  # in the footer once there are streams to choose from
            return self._streams_to_choose
        if action == "job_log":
            return job_log_of(self.process_watch) is not None
        return True

    def _available(self, action: str) -> bool:
        name = action.partition("(")[0]
        return self.check_action(name, setting_keys.parameters(action)) is not False

    def _can(self) -> Changeable:
        """What this run can change, as the controller last said (tui.model.changeable)."""
        return self._control.can_change if self._control is not None else Changeable()

    def on_key(self, event: events.Key) -> None:
        """A key this session does not offer (hidden from the footer): say why, change nothing."""
        if isinstance(self.screen, HelpScreen):
            return
        if self.controller is not None:
            why, title = setting_keys.key_refusal(event.key, self._can()), "change refused"
        else:  # a replay: nothing to change, and no job of its own (keys that did nothing, silently)
            why = setting_keys.replay_refusal(event.key, self._available("job_log"))
            title = "not in this session"
        if why:
            event.stop()
            self._refuse(why, title)

    def _refuse(self, why: str, title: str = "change refused") -> None:
        """A refused key: a toast, and the reason in the status line for a while."""
        self.notify(why, title=title, severity="error")
        self.refused.set(why)
        self._update_status()

    def action_help(self) -> None:
        """Every key, grouped; the ones this session cannot use are marked."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self._available, setting_keys.help_line(self._can(), self.controller)))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): every action of the keys, by name, plus Textual's own."""
        yield from super().get_system_commands(screen)
        for k in KEYS:
            if self._available(k.action):
                yield SystemCommand(
                    f"{k.help} [{key_name(k.keys, k.display)}]",
                    f"{k.group}: {k.label}",
                    lambda action=k.action: self.call_later(self.run_action, action),
                )

    def action_job_log(self) -> None:
        """The job's output (l): every rank's last lines, the first failing rank's error first."""
        log = job_log_of(self.process_watch)
        if log is not None and not isinstance(self.screen, JobLogScreen):
            self.push_screen(JobLogScreen(log))

    def _show_connect(self, show: bool) -> None:
        for panel in self.query(ConnectPanel):
            panel.display = show

    def action_toggle_connect(self) -> None:
        """Show or hide how to connect workers (``commtop watch``)."""
        self._connect_auto = False
        for panel in self.query(ConnectPanel):
            panel.display = not panel.display

    def action_next_stream(self) -> None:
        """Latency lines of the next stream (group, op, size), after the last every collective's."""
        if self.ingest is not None:  # chosen on the ingest thread, so quick presses step on in order
            self.ingest.request_stream(NEXT_STREAM)

    def action_toggle_view(self) -> None:
        grid = self._one(RankGrid)
        grid.toggle_view()
        self._want_run_stats(grid)

    def _want_run_stats(self, grid: RankGrid) -> None:
        """Whole-run numbers are drawn only by the rows view, on a rank's second line and below."""
        self.whole_run_stats = grid.shown_view == "rows" and grid.row_h > 1

    def watch_whole_run_stats(self, on: bool) -> None:
        if self.ingest is not None:
            self.ingest.request_whole_run_stats(on)

    def _current(self) -> Settings | None:
        """Settings to change from: what the controller was last asked for, which it starts from
        the settings the workers report in force (None until they did; it refuses changes then)."""
        if self.controller is None:
            return None
        try:
            view = self.controller.view()
        except Exception:
            return None
        return view.requested if view is not None else None

    def _request(self, changes: dict[str, Any]) -> None:
        if self.controller is None:
            return
        current = self._current()
        before = current.as_dict() if current is not None else {}
        try:
            error = self.controller.request(changes)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error:
            self._refuse(error)
        else:  # the change made ("copies 5 → 6"), as the header's banner says it
            self.notify(f"requested {settings_change(before, changes) or 'no change'}", timeout=2)
        self._side_poll()

    # Unknown settings (None) count as mode none, no copies, size x1, pinned, d2h.

    def action_cycle_mode(self) -> None:
        current = self._current()
        self._request({"mode": setting_keys.next_mode(current.mode if current is not None else "", self._can())})

    def action_pick_mode(self, index: int) -> None:
        self._request({"mode": MODES[index]})

    def action_copies(self, delta: int) -> None:
        current = self._current()
        copies = current.copies if current is not None else 0
        self._request({"copies": max(0, min(MAX_COPIES, copies + delta))})

    def action_cycle_scale(self) -> None:
        current = self._current()
        scale = current.copy_scale if current is not None else 1.0
        i = COPY_SCALES.index(scale) if scale in COPY_SCALES else -1
        self._request({"copy_scale": COPY_SCALES[(i + 1) % len(COPY_SCALES)]})

    def action_toggle_pinned(self) -> None:
        current = self._current()
        self._request({"pinned": not (current.pinned if current is not None else True)})

    def action_toggle_direction(self) -> None:
        current = self._current()
        cur = current.direction if current is not None else DIRECTIONS[0]
        self._request({"direction": DIRECTIONS[1] if cur == DIRECTIONS[0] else DIRECTIONS[0]})

    def _show_verdict(self) -> None:
        snap = self.snapshot
        peak = pcie_peak(snap.telemetry) if snap else None
        idle = replay_idle_text(self.replay.position()) if self.replay is not None else ""
        text = verdict_text(self.ab.progress(), snap.epochs if snap else None, peak, idle, self._can())
        modes = snap is None or snap.job.has_modes  # a job without a mode knob has no modes to compare
        said = modes or text.startswith("A/B")  # what a job without modes may hear
        line = self._one(VerdictLine)
        line.display = said  # a job without modes: no line (its ranks get it) until an A/B says something
        line.show(text if said else "")

    def action_ab(self) -> None:
        """Start an A/B of the current settings against none (a dialog lets you change both);
        while one runs, stop it (the blocks so far still give a result)."""
        if self.controller is None:
            return
        if self.ab.running:
            self.ab.stop()
            self.notify("A/B stopped early", timeout=2)
            self._show_verdict()
            return
        from tui.view.widgets.ab_dialog import ABDialog

        self.push_screen(ABDialog(*setting_keys.default_arms(self._can(), self._current())), self._start_ab)

    def _start_ab(self, choice: Any) -> None:
        if choice is None or self.controller is None:
            return
        why = setting_keys.arms_refusal(self._can(), choice.a, choice.b)
        if why:  # both arms checked before a block starts
            self._refuse(why)
            return
        mark = self.recorder.write if self.recorder is not None else None
        self.ab.start(self.controller, choice.a, choice.b, duration_s=choice.duration_s, mark=mark)
        self.notify("A/B started: a again stops it", timeout=3)
        self._show_verdict()

    def action_toggle_record(self) -> None:
        if self.recorder is None:
            return
        try:
            if self.recorder.status().active:
                self.recorder.stop()
                self.notify(f"recording saved as {self.recorder.status().path}", timeout=3)
            else:
                path = self.recorder.start()
                self.notify(f"recording to {path}", timeout=3)
        except Exception as exc:
            self.notify(f"{type(exc).__name__}: {exc}", title="recording", severity="error")
        self._side_poll()

    def action_replay_pause(self) -> None:
        if self.replay is not None:
            self.replay.toggle_pause()
            self._side_poll()

    def action_replay_speed(self, direction: int) -> None:
        if self.replay is None:
            return
        speed = self.replay.position().speed
        faster = [s for s in REPLAY_SPEEDS if s > speed + 1e-9]
        slower = [s for s in REPLAY_SPEEDS if s < speed - 1e-9]
        target = (faster[0] if faster else speed) if direction > 0 else (slower[-1] if slower else speed)
        self.replay.set_speed(target)
        self._side_poll()

    def action_replay_seek(self, delta_s: float) -> None:
        if self.replay is not None:
            self.replay.seek(delta_s)
            self._side_poll()

    def action_replay_jump(self, direction: int) -> None:
        if self.replay is not None:
            self.replay.jump_change(direction)
            self._side_poll()
