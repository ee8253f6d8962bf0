"""Measuring the real commtop app under ``run_test`` (headless) without changing it.

* :class:`FrameMeter` wraps, for this process only, Textual's screen update (layout +
  compositor + display) and the app's ``show_snapshot``: a *frame* is applying one snapshot
  plus the paint that puts it on screen. Headless Textual skips turning the update into
  terminal escape codes; the meter does that work too (and throws the text away), so a
  frame costs what it costs on a real terminal.
* :class:`LagProbe` measures how late the event loop wakes a 10 ms sleep (what a key press
  would wait).
* :func:`spawn_publishers` starts the synthetic fleet (``_synth_publisher.py``) in separate
  processes; :func:`publisher_totals` collects their JSON lines.
* :func:`thread_cpu` reads one thread's CPU seconds (the ingest thread vs the UI thread).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _common import percentile
from textual import app as textual_app
from textual import screen as textual_screen
from textual._compositor import CompositorUpdate

HERE = Path(__file__).resolve().parent


class FrameMeter:
    """Times snapshot application and painting of one app (installed before it runs)."""

    active: FrameMeter | None = None
    _patched = False

    def __init__(self, app: Any, on_frame: Callable[[Any, int], None] | None = None) -> None:
        self.app = app
        self.on_frame = on_frame  # (snapshot, painted_at_ns) after the paint that shows it
        self.apply_ms: list[float] = []
        self.paint_ms: list[float] = []
        self.frame_ms: list[float] = []
        self._pending: tuple[float, Any] | None = None
        self._wrap_show(app)
        FrameMeter.active = self
        FrameMeter._patch_textual()

    def reset(self) -> None:
        self.apply_ms.clear()
        self.paint_ms.clear()
        self.frame_ms.clear()

    def _wrap_show(self, app: Any) -> None:
        show = app.show_snapshot

        def timed_show(snap: Any) -> None:
            t0 = time.perf_counter()
            show(snap)
            dt = (time.perf_counter() - t0) * 1e3
            self.apply_ms.append(dt)
            self._pending = (dt, snap)

        app.show_snapshot = timed_show

    def painted(self, screen: Any, dt_ms: float) -> None:
        if screen.app is not self.app:
            return
        self.paint_ms.append(dt_ms)
        if self._pending is not None:
            apply_ms, snap = self._pending
            self._pending = None
            self.frame_ms.append(apply_ms + dt_ms)
            if self.on_frame is not None:
                self.on_frame(snap, time.time_ns())

    @classmethod
    def _patch_textual(cls) -> None:
        if cls._patched:
            return
        cls._patched = True
        update = textual_screen.Screen._on_timer_update
        display = textual_app.App._display

        def timed_update(screen: Any) -> None:
            t0 = time.perf_counter()
            update(screen)
            meter = cls.active
            if meter is not None:
                meter.painted(screen, (time.perf_counter() - t0) * 1e3)

        def display_as_terminal(app: Any, screen: Any, renderable: Any) -> None:
            display(app, screen, renderable)
            if app.is_headless and not app._batch_count and isinstance(renderable, CompositorUpdate):
                renderable.render_segments(app.console)  # the escape codes a terminal would get

        textual_screen.Screen._on_timer_update = timed_update  # type: ignore[method-assign, assignment]
        textual_app.App._display = display_as_terminal  # type: ignore[method-assign, assignment]


class LagProbe:
    """How late the event loop runs a task that sleeps 10 ms (UI responsiveness)."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lag_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.lag_ms.append(max(0.0, (time.perf_counter() - t0 - self.period_s) * 1e3))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def thread_cpu(native_id: int | None) -> float:
    """CPU seconds (user + system) of one thread of this process; 0 if it is gone."""
    if native_id is None:
        return 0.0
    for t in psutil.Process().threads():
        if t.id == native_id:
            return float(t.user_time + t.system_time)
    return 0.0


async def quiesce(app: Any, pilot: Any) -> None:
    """Stop the app's ingest thread and let the queued snapshot be applied while the widgets
    still exist (a SnapshotReady handled during unmount raises NoMatches in this Textual)."""
    if app.ingest is not None:
        app.ingest.stop()
        await asyncio.to_thread(app.ingest.join, 2.0)
    await pilot.pause()


def main_thread_id() -> int | None:
    return threading.main_thread().native_id


def spawn_publishers(
    connection_path: str,
    world: int,
    rate: float,
    seconds: float,
    processes: int,
    start_at: float,
    *,
    batch_ms: float | None = None,
    dur_us: float = 64.0,
) -> list[subprocess.Popen[str]]:
    """``processes`` synthetic publisher processes sharing ``world`` ranks; batches every
    ``batch_ms``, by default what a worker of a ``world``-rank job uses (50 ms up to 16 ranks,
    then spaced with the world size: workers.wire.config.batch_ms_for_world)."""
    if batch_ms is None:
        try:
            from workers.wire.config import batch_ms_for_world

            batch_ms = batch_ms_for_world(50.0, world)
        except ImportError:  # a checkout from before the batch spacing (a baseline): every 50 ms
            batch_ms = 50.0
    processes = max(1, min(processes, world))
    bounds = [round(i * world / processes) for i in range(processes + 1)]
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_synth_publisher.py"),
                "--connection-file",
                connection_path,
                "--ranks",
                f"{bounds[i]}:{bounds[i + 1]}",
                "--world",
                str(world),
                "--rate",
                str(rate),
                "--seconds",
                str(seconds),
                "--batch-ms",
                str(batch_ms),
                "--dur-us",
                str(dur_us),
                "--start-at",
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]


def publisher_totals(procs: list[subprocess.Popen[str]], timeout_s: float = 60.0) -> dict[str, float]:
    """Sum of the publishers' JSON lines (sent, dropped, late_ticks, cpu_s)."""
    total: dict[str, float] = {"sent": 0, "dropped": 0, "late_ticks": 0, "cpu_s": 0.0, "per_batch": 0}
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"synthetic publisher failed (exit {proc.returncode}): {err.strip()[-400:]}")
        data = json.loads(lines[-1])
        for k in total:
            total[k] += data.get(k, 0) if k != "per_batch" else 0
        total["per_batch"] = data.get("per_batch", 0)
    return total


# --------------------------------------------------------------------------- one measured run

FRAME_TARGET_MS = 100.0


@dataclass
class Level:
    """What one run of the app under a synthetic fleet measured."""

    rate: float
    ranks: int
    seconds: float
    sent: int = 0
    dropped: int = 0  # at the publishers (queue full)
    received: int = 0
    in_window: int = 0  # records/s the model applied during the measured window
    rejected: int = 0
    drain_s: float = 0.0
    late_ticks: int = 0
    frames: int = 0
    frame_ms: list[float] = field(default_factory=list)
    apply_ms: list[float] = field(default_factory=list)
    paint_ms: list[float] = field(default_factory=list)
    snapshot_ms: list[float] = field(default_factory=list)
    lag_ms: list[float] = field(default_factory=list)
    cpu_pct: float = float("nan")
    ingest_pct: float = float("nan")
    ui_pct: float = float("nan")
    pub_cpu_pct: float = float("nan")
    view: str = ""
    lines: int = 0
    screen_lines: int = 0

    @property
    def lost(self) -> int:
        return self.dropped + max(0, self.sent - self.received) + self.rejected

    def p(self, name: str, q: float) -> float:
        values: list[float] = getattr(self, name)
        return percentile(values, q)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.drain_s < 0.5 and self.p("frame_ms", 99) < FRAME_TARGET_MS


def _records(app: Any) -> int:
    ingest = app.ingest
    if ingest is None:
        return 0
    with ingest.lock:
        return int(app.model.records)


async def drive(
    rate: float,
    ranks: int,
    seconds: float,
    processes: int,
    size: tuple[int, int],
    *,
    interval_s: float = 0.08,
    dur_us: float = 64.0,
    screenshot: str = "",
    lag_probe: bool = True,
) -> Level:
    """The real app (LiveSource + RunModel + IngestLoop, headless) fed by ``ranks`` synthetic
    ranks at ``rate`` records/s for ``seconds``; measured over the steady part. ``lag_probe``:
    also measure the event loop's lag (a 100 Hz task in the app's loop: 2-4 % of a core on the
    2-core VM, counted as the app's CPU; leave it off where the lag is not reported)."""
    from tui.ingest.sources import LiveSource
    from tui.model.run_model import RunModel
    from tui.view.app import CommtopApp
    from tui.view.widgets.rank_grid import RankGrid
    from workers.wire.connection import create_run

    conn = create_run(label="tui-bench")
    model = RunModel()
    level = Level(rate, ranks, seconds)
    build = model.snapshot

    def timed_snapshot(*args: Any, **kwargs: Any) -> Any:  # runs on the ingest thread
        t0 = time.perf_counter()
        snap = build(*args, **kwargs)
        level.snapshot_ms.append((time.perf_counter() - t0) * 1e3)
        return snap

    model.snapshot = timed_snapshot  # type: ignore[method-assign, assignment]
    app = CommtopApp(
        LiveSource(conn), model, owns_source=True, title="commtop benchmark", interval_s=interval_s, tune_gc=True
    )
    meter = FrameMeter(app)
    async with app.run_test(size=size) as pilot:
        start_at = time.time() + 1.5  # publishers import numpy/zmq and connect first
        pubs = spawn_publishers(str(conn.path), ranks, rate, seconds, processes, start_at, dur_us=dur_us)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        ingest_tid = app.ingest._thread.native_id if app.ingest and app.ingest._thread else None
        await asyncio.sleep(min(1.0, seconds * 0.2))  # the steady state, not the first batches
        meter.reset()
        level.snapshot_ms.clear()
        lag = LagProbe()
        if lag_probe:
            lag.start()
        r0, c0, i0, u0 = _records(app), time.process_time(), thread_cpu(ingest_tid), thread_cpu(main_thread_id())
        t0 = time.perf_counter()
        await asyncio.sleep(max(0.2, seconds * 0.8 - 0.3))
        r1, c1, i1, u1 = _records(app), time.process_time(), thread_cpu(ingest_tid), thread_cpu(main_thread_id())
        wall = time.perf_counter() - t0
        lag.stop()
        level.frame_ms, level.apply_ms, level.paint_ms = (
            list(meter.frame_ms),
            list(meter.apply_ms),
            list(meter.paint_ms),
        )
        level.snapshot_ms = list(level.snapshot_ms)
        grid = app.query_one(RankGrid)
        level.view = grid.shown_view
        level.lines = grid.virtual_size.height
        level.screen_lines = grid.size.height
        if screenshot:
            app.save_screenshot(screenshot)
        totals = await asyncio.to_thread(publisher_totals, pubs)
        if not totals.get("sent"):  # nothing reached a socket: the numbers below would mean nothing
            raise SystemExit(
                f"benchmark: the synthetic publishers sent no record ({totals.get('dropped', 0):,.0f} dropped): "
                "they no longer speak the protocol (see _synth_publisher.py)"
            )
        ended = time.perf_counter()
        # Drained: every queued record applied, or nothing new for 2 s (lost), at most 20 s.
        expected = int(totals["sent"])
        last, last_change = _records(app), time.perf_counter()
        while last < expected and time.perf_counter() - last_change < 2.0 and time.perf_counter() - ended < 20:
            await asyncio.sleep(0.01)
            now = _records(app)
            if now != last:
                last, last_change = now, time.perf_counter()
        level.drain_s = max(0.0, last_change - ended) if last >= expected else time.perf_counter() - ended
        level.received = last
        level.rejected = sum(app.source.rejected.values()) if app.source is not None else 0
        await quiesce(app, pilot)
    level.in_window = int((r1 - r0) / wall)
    level.sent, level.dropped = int(totals["sent"]), int(totals["dropped"])
    level.late_ticks = int(totals["late_ticks"])
    level.pub_cpu_pct = totals["cpu_s"] / seconds * 100
    level.cpu_pct = (c1 - c0) / wall * 100
    level.ingest_pct = (i1 - i0) / wall * 100
    level.ui_pct = (u1 - u0) / wall * 100
    level.frames = len(level.frame_ms)
    level.lag_ms = lag.lag_ms
    return level


# --------------------------------------------------------------------------- same-run reference


@dataclass
class Reference:
    """What the minimal reference app cost on this machine, in this run."""

    frames: int
    cpu_pct: float
    paint_ms: list[float]

    def p(self, q: float) -> float:
        return percentile(self.paint_ms, q)


async def reference_paint(size: tuple[int, int], hz: float, seconds: float, runs_per_line: int = 12) -> Reference:
    """The floor under any full-screen Textual app: a bare app whose one Line-API widget
    redraws every line of the screen ``hz`` times a second, each line ``runs_per_line``
    coloured runs (what a rank row or a heat-map line is), with no model and no ingest.

    The benchmarks report commtop's CPU as a ratio to this, measured in the same run, so a
    slow or busy machine moves both alike."""
    from rich.segment import Segment
    from rich.style import Style
    from textual.app import App, ComposeResult
    from textual.strip import Strip
    from textual.widget import Widget

    w, h = size
    palette = [Style(color=f"#{(37 * i) % 256:02x}{(91 * i) % 256:02x}c0") for i in range(16)]

    class Lines(Widget):
        DEFAULT_CSS = "Lines { height: 1fr; }"
        tick = 0

        def render_line(self, y: int) -> Strip:
            run = max(1, w // runs_per_line)
            segs = [
                Segment("▁▃▅▇"[(y + j + self.tick) % 4] * run, palette[(y + j + self.tick) % 16])
                for j in range(runs_per_line)
            ]
            return Strip(segs, run * runs_per_line).extend_cell_length(w)

    class Bare(App[None]):
        # The widget is held, not queried: a tick that fired while run_test tore the screen
        # down found no Lines (NoMatches), and the reference run died (1 run in ~15 on the VM).
        lines = Lines()

        def compose(self) -> ComposeResult:
            yield self.lines

        def on_mount(self) -> None:
            self.set_interval(1 / hz, self.advance)

        def advance(self) -> None:
            self.lines.tick += 1
            self.lines.refresh()

    app = Bare()
    meter = FrameMeter.__new__(FrameMeter)  # paint timing only: no snapshots in this app
    meter.app, meter.on_frame, meter._pending = app, None, None
    meter.apply_ms, meter.paint_ms, meter.frame_ms = [], [], []
    FrameMeter.active = meter
    FrameMeter._patch_textual()
    async with app.run_test(size=(w, h)) as pilot:
        await asyncio.sleep(min(1.0, seconds * 0.2))
        meter.reset()
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        c1, wall = time.process_time(), time.perf_counter() - t0
        paint = list(meter.paint_ms)
        await pilot.pause()
    FrameMeter.active = None
    return Reference(frames=len(paint), cpu_pct=(c1 - c0) / wall * 100, paint_ms=paint)
