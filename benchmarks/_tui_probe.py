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
from pathlib import Path
from typing import Any

import psutil
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

        textual_screen.Screen._on_timer_update = timed_update  # type: ignore[method-assign]
        textual_app.App._display = display_as_terminal  # type: ignore[method-assign]


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
    batch_ms: float = 50.0,
    dur_us: float = 64.0,
) -> list[subprocess.Popen[str]]:
    """``processes`` synthetic publisher processes sharing ``world`` ranks."""
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
