"""Replay a recording through the same ingest path as a live run.

:class:`ReplaySource` is a ``Source`` (poll/close/rejected) and ``ReplayControls`` (pause,
speed, seek, jump to the next settings change). Messages come out paced by their recorded
receive times, scaled by the speed; seeking forward hands over everything up to the target
at once, seeking back returns ``ResetModel()`` first and re-feeds from the start (decoding is
columnar and fast, so this takes well under a second for an hour of one node).

The clock is injectable, so tests drive it without sleeping.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from tui.ingest.interfaces import ReplayPosition, ResetModel
from tui.recordings.codec import chunk_messages
from tui.recordings.reader import Recording, open_recording
from workers.wire.protocol import Message

MIN_SPEED = 0.25
MAX_SPEED = 64.0
#: Most messages one poll hands over (a seek re-feeds in several polls, the UI keeps breathing).
MAX_PER_POLL = 20_000
#: Shortest wait for the next message (never spin on a clock that does not move).
MIN_WAIT_S = 0.001
#: A "previous change" press this soon (wall-clock seconds, at any speed) after the replay
#: reached a change, or jumped to one, goes to the change before it.
BACK_GRACE_S = 1.0


class ReplaySource:
    """Feeds a recording's messages by their receive time; see the module docstring."""

    def __init__(
        self,
        recording: Recording,
        *,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_per_poll: int = MAX_PER_POLL,
    ) -> None:
        self.recording = recording
        self.rejected: Counter[str] = Counter()
        for note in recording.problems:  # shown like refused frames: "corrupt" n
            self.rejected["corrupt" if note.startswith("corrupt") else "undecodable"] += 1
        self._clock = clock
        self._max = max_per_poll
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._t0 = recording.first_ns
        self._duration = max(0.0, (recording.last_ns - recording.first_ns) / 1e9)
        self._changes = self._find_changes()
        self._speed = _clamp_speed(speed)
        self._paused = False
        self._base_pos = 0.0
        self._base_wall = clock()
        self._chunk = 0  # next chunk to decode
        self._queue: list[tuple[int, Message]] = []  # decoded, not yet delivered (of chunk - 1)
        self._qi = 0
        self._delivered_ns = self._t0 - 1
        self._reset = False
        self._landed: tuple[int, float] | None = None  # (change index, clock) of the last jump

    # ---- what the header shows
    @property
    def warning(self) -> str:
        """One line on a damaged or incomplete recording ("" when it is clean)."""
        return self.recording.summary()

    @property
    def meta(self) -> dict[str, Any]:
        return self.recording.meta

    def now_ns(self) -> int:
        """The recorded wall-clock time the replay has reached (for staleness and ages)."""
        return self._t0 + int(self._pos() * 1e9)

    def _find_changes(self) -> tuple[float, ...]:
        """Seconds from the start at which a higher settings epoch first appears."""
        coll = self.recording.tables(coll_columns=("epoch", "recv_ns")).coll
        epochs, recv = coll["epoch"], coll["recv_ns"]
        if len(epochs) == 0:
            return ()
        top = np.maximum.accumulate(epochs)
        rises = np.flatnonzero(top[1:] > top[:-1]) + 1
        # Rounded UP to the microsecond: a jump lands just after the epoch's first record, never
        # just before it (then a paused replay showed the previous epoch and `n` seemed to skip).
        return tuple(sorted({math.ceil((int(recv[i]) - self._t0) / 1e3) / 1e6 for i in rises}))

    @functools.cached_property
    def epoch_settings(self) -> dict[int, dict[str, Any]]:
        """Settings per epoch from the recording's hellos (its first hello of each epoch), so a
        jump shows the settings in force at once, not those of the last hello before it."""
        out: dict[int, dict[str, Any]] = {}
        for _t, hello in self.recording.tables(coll_columns=("epoch",)).hellos:
            if hello.settings:
                out.setdefault(hello.epoch, dict(hello.settings))
        return out

    # ---- clock
    def _pos(self) -> float:
        if self._paused:
            return self._base_pos
        return min(self._duration, self._base_pos + (self._clock() - self._base_wall) * self._speed)

    def _rebase(self, pos: float) -> None:
        self._base_pos = min(max(pos, 0.0), self._duration)
        self._base_wall = self._clock()

    # ---- Source
    def poll(self, timeout_s: float) -> list[Message | ResetModel]:
        self._wake.clear()  # a control call from now on ends the wait below early
        out = self._take()
        if out or timeout_s <= 0 or self._closed:
            return out
        with self._lock:
            wait = timeout_s
            nxt = self._next_ns()
            if not self._paused and nxt is not None:
                ahead = (nxt - self._t0) / 1e9 - self._pos()
                wait = min(timeout_s, max(MIN_WAIT_S, ahead / self._speed))
        self._wake.wait(wait)
        return self._take()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self.recording.close()

    def _next_ns(self) -> int | None:
        """Receive time of the next undelivered message (decoding its chunk if needed)."""
        while self._qi >= len(self._queue):
            if self._chunk >= len(self.recording.chunks):
                return None
            chunk = self.recording.decode(self.recording.chunks[self._chunk])
            self._chunk += 1
            self._queue = chunk_messages(chunk) if chunk is not None else []
            self._qi = 0
        return self._queue[self._qi][0]

    def _take(self) -> list[Message | ResetModel]:
        with self._lock:
            if self._closed:
                return []
            out: list[Message | ResetModel] = []
            if self._reset:
                out.append(ResetModel())
                self._reset = False
            until = self._t0 + int(round(self._pos() * 1e9))
            while len(out) < self._max:
                nxt = self._next_ns()
                if nxt is None or nxt > until:
                    break
                t, msg = self._queue[self._qi]
                self._qi += 1
                self._delivered_ns = t
                out.append(msg)
            return out

    # ---- ReplayControls
    def toggle_pause(self) -> None:
        with self._lock:
            self._rebase(self._pos())
            self._paused = not self._paused
        self._wake.set()

    def set_speed(self, factor: float) -> None:
        with self._lock:
            self._rebase(self._pos())
            self._speed = _clamp_speed(factor)
        self._wake.set()

    def seek(self, delta_s: float) -> None:
        with self._lock:
            self._seek_to(self._pos() + delta_s)
            self._landed = None
        self._wake.set()

    def jump_change(self, direction: int) -> None:
        """``n`` (+1): to the next change. ``p`` (-1): back to the start of the change the replay
        is in, or to the one before when that change was reached (or jumped to) less than
        BACK_GRACE_S ago, in wall-clock time: at ×4 a second is 4 s of the recording, and a
        replay-time grace made ``p`` right after ``n`` land on the change ``n`` had just found."""
        with self._lock:
            pos, wall, changes = self._pos(), self._clock(), self._changes
            if direction > 0:
                later = [i for i, c in enumerate(changes) if c > pos + 1e-6]
                if later:
                    self._seek_to(changes[later[0]])
                    self._landed = (later[0], wall)
            else:
                target = self._back_from(pos, wall)
                self._seek_to(changes[target] if target >= 0 else 0.0)
                self._landed = (target, wall) if target >= 0 else None
        self._wake.set()

    def _back_from(self, pos: float, wall: float) -> int:
        """The index of the change ``p`` goes to from ``pos`` (-1: the start)."""
        changes = self._changes
        landed = self._landed
        if landed is not None and wall - landed[1] < BACK_GRACE_S:
            return landed[0] - 1
        current = max((i for i, c in enumerate(changes) if c <= pos + 1e-6), default=-1)
        if current >= 0 and (pos - changes[current]) / self._speed < BACK_GRACE_S:
            return current - 1  # reached it a moment ago: the one before
        return current

    def _seek_to(self, target: float) -> None:
        target = min(max(target, 0.0), self._duration)
        if self._t0 + int(round(target * 1e9)) < self._delivered_ns:
            self._chunk, self._queue, self._qi = 0, [], 0  # back: rebuild from the start
            self._delivered_ns = self._t0 - 1
            self._reset = True
        self._rebase(target)

    def position(self) -> ReplayPosition:
        with self._lock:
            pos = self._pos()
            done = self._chunk >= len(self.recording.chunks) and self._qi >= len(self._queue)
            return ReplayPosition(
                position_s=pos,
                duration_s=self._duration,
                speed=self._speed,
                paused=self._paused,
                changes_s=self._changes,
                finished=done and pos >= self._duration,
            )


def _clamp_speed(factor: float) -> float:
    return float(min(MAX_SPEED, max(MIN_SPEED, factor)))


def open_replay(
    path: str | os.PathLike[str], *, speed: float = 1.0, clock: Callable[[], float] = time.monotonic
) -> ReplaySource:
    """A ReplaySource over ``path``; raises RecordingError (a ValueError, one line) if the file
    is not a recording. Damage is not an error: see ``ReplaySource.warning``."""
    return ReplaySource(open_recording(path), speed=speed, clock=clock)
