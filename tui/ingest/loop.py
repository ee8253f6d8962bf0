"""The ingest thread: source -> model (+ sinks), and one frozen Snapshot per tick for the UI.

Ingest is not rendering: this thread never touches a widget. It drains the source, applies
every message into the model under a lock, hands each message to the sinks (the recorder,
the control server), and every ``interval_s`` builds a Snapshot if anything changed and
passes it to ``on_snapshot`` (the app posts ONE Textual message from there; Textual's
``post_message`` is thread-safe). A sink or callback that raises is reported, never fatal.
The other way, the view asks for what the snapshots should hold (``request_whole_run_stats``):
the request is queued and applied to the model on this thread, under the lock.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from tui.ingest.interfaces import ResetModel, Sink, Source
from tui.model.run_model import RunModel
from tui.model.snapshot import Snapshot
from tui.model.snapshot_builder import TEXT_EVERY_S

#: Even with no new messages a snapshot is rebuilt this often (liveness ages with time).
IDLE_SNAPSHOT_S = 0.5
#: Messages applied between two chances to emit a snapshot: 512 ranks' batches arrive in
#: bursts of hundreds (~0.1 ms each), and a snapshot waiting for a whole burst came late.
APPLY_CHUNK = 128
#: Above this many ranks snapshots come at most every LARGE_WORLD_INTERVAL_S: a 512-rank
#: snapshot and its heat map cost ~20 ms each, and 10 frames/s of a 512-row heat map is as
#: readable as 15 (the same data, in ~2/3 of the CPU).
LARGE_WORLD_RANKS = 256
LARGE_WORLD_INTERVAL_S = 1 / 11
MAX_ERRORS = 20


class IngestLoop:
    """Runs ``source -> model`` on a daemon thread; ``start()`` / ``stop()`` / ``join()``.

    ``clock`` (ns) stamps arrivals and snapshots; by default the source's own ``now_ns``
    when it has one (a replay's virtual clock, so a paused replay does not turn every
    rank stale), else the model's clock.
    """

    def __init__(
        self,
        source: Source,
        model: RunModel,
        sinks: Iterable[Sink] = (),
        on_snapshot: Callable[[Snapshot], None] | None = None,
        interval_s: float = 0.08,
        *,
        poll_s: float = 0.02,
        clock: Callable[[], int] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.source = source
        self.model = model
        self.sinks = list(sinks)
        self.on_snapshot = on_snapshot
        self.interval_s = interval_s
        self.poll_s = poll_s
        self.clock: Callable[[], int] = clock or getattr(source, "now_ns", None) or model.clock
        self.on_error = on_error
        self.lock = threading.Lock()
        #: Recent errors of sinks/callbacks/source ("Recorder: No space left on device").
        self.errors: deque[str] = deque(maxlen=MAX_ERRORS)
        self.applied = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_version = -1
        self._last_emit = 0.0
        self._built_avg_s: float | None = None
        #: Whether the last interval brought news (a steady stream): the thread then sleeps until
        #: the next snapshot is due instead of waking for the first message after each snapshot.
        self._streaming = False
        self._latest: Snapshot | None = None
        #: Requests of the view, applied to the model before the next snapshot (ingest thread):
        #: whole-run statistics on/off (a bool), or the stream to draw (``("stream", value)``).
        self._requests: queue.SimpleQueue[bool | tuple[str, int]] = queue.SimpleQueue()

    # ----------------------------------------------------------------------- thread

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="commtop-ingest", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        taken = 0
        while not self._stop.is_set():
            gather = self._gather_wait(taken)
            if gather > 0:
                # Let what comes until the snapshot is due queue in the source: one wake-up per
                # snapshot, not one per message (8 ranks send 160 batches a second, 64 ranks 320).
                self._stop.wait(gather)
            taken = self.step(0.0 if gather > 0 else self._poll_timeout(), self._emit_safely)
            self._emit_safely()

    def _gather_wait(self, taken: int) -> float:
        """Seconds to sleep before the next poll: until the next snapshot is due when something
        changed since the last one, or while messages stream in (nothing can be shown earlier),
        unless the last poll took a whole chunk (a backlog, drained at once). 0 after a quiet
        interval: the poll then waits for the first message, so a change after a quiet spell
        is shown at once.

        One wake-up per snapshot, not one for the first message after it and another when the
        snapshot is due: in an in-process run of the 64-rank model paced in real time on the
        2-core VM, the same apply and snapshot work cost ~1.5x the CPU of an unpaced run at one
        wake-up per snapshot and ~2x at three (caches gone cold while the thread slept)."""
        if taken >= APPLY_CHUNK or (self.model.version == self._last_version and not self._streaming):
            return 0.0
        return self._last_emit + self._interval() - time.monotonic()

    def _emit_safely(self) -> None:
        try:
            self.maybe_emit()
        except Exception as exc:  # a snapshot bug must not end ingest: report it, keep going
            self._report(f"snapshot: {type(exc).__name__}: {exc}")
            self._last_emit = time.monotonic()

    def _interval(self) -> float:
        """Seconds between snapshots: ``interval_s``, longer for the largest worlds."""
        if len(self.model.ranks) > LARGE_WORLD_RANKS:
            return max(self.interval_s, LARGE_WORLD_INTERVAL_S)
        return self.interval_s

    def _poll_timeout(self) -> float:
        """Wait for messages at most until the next snapshot is due when something changed,
        so snapshots go out every interval (not the interval plus up to one poll)."""
        if self.model.version == self._last_version:
            return self.poll_s
        due = self._last_emit + self._interval() - time.monotonic()
        return min(self.poll_s, max(0.0, due))

    # ----------------------------------------------------------------------- work

    def step(self, timeout_s: float, between: Callable[[], object] | None = None) -> int:
        """One poll of the source; applies what came, in chunks of APPLY_CHUNK messages with
        ``between`` called between two chunks. Returns the number of messages."""
        try:
            messages = self.source.poll(timeout_s)
        except Exception as exc:  # a source must not raise, but ingest must survive one that does
            self._report(f"source: {type(exc).__name__}: {exc}")
            time.sleep(timeout_s)
            return 0
        if not messages:
            with self.lock:
                self.model.set_rejected(self.source.rejected)
            return 0
        for at in range(0, len(messages), APPLY_CHUNK):
            chunk = messages[at : at + APPLY_CHUNK]
            if at and between is not None:
                between()  # a snapshot may be due in the middle of a burst
            with self.lock:
                now = self.clock()
                for message in chunk:
                    if isinstance(message, ResetModel):
                        self.model.reset()
                    else:
                        self.model.apply(message, now)
                self.model.set_rejected(self.source.rejected)
            self.applied += len(chunk)
            for sink in self.sinks:
                for message in chunk:
                    if isinstance(message, ResetModel):
                        continue
                    try:
                        sink.write(message)
                    except Exception as exc:
                        self._report(f"{type(sink).__name__}: {exc}")
                        break  # one report per sink per chunk
        return len(messages)

    def request_whole_run_stats(self, on: bool) -> None:
        """Ask for the ranks' whole-run statistics to be refreshed in the snapshots (on) or kept
        at their last values (off: nothing on screen shows them). Any thread; the model changes
        on the ingest thread, before the next snapshot."""
        self._requests.put(on)

    def request_stream(self, value: int) -> None:
        """Ask for one stream's latency lines (its ring value, tui.model.streams), every
        collective's (-1) or the next stream's (NEXT_STREAM). Any thread; applied on the ingest
        thread, in order, before the next snapshot."""
        self._requests.put(("stream", value))

    def _apply_requests(self) -> None:
        """The view's queued requests, the newest last (lock held)."""
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return
            if isinstance(request, tuple):
                self.model.select_stream(request[1])
            else:
                self.model.whole_run_stats = request

    def snapshot(self, fresh_run_stats: bool = False, text_every_s: float = 0.0) -> Snapshot:
        """A fresh snapshot (thread-safe; also used by the headless collector at the end);
        the screen's own (maybe_emit) rebuild their text at most every TEXT_EVERY_S (between two
        such ticks only the history moves: SnapshotBuilder._between_ticks)."""
        with self.lock:
            self._apply_requests()
            snap = self.model.snapshot(self.clock(), fresh_run_stats=fresh_run_stats, text_every_s=text_every_s)
        self._latest = snap
        return snap

    @property
    def latest(self) -> Snapshot | None:
        """The last snapshot built, if any."""
        return self._latest

    def maybe_emit(self, force: bool = False) -> Snapshot | None:
        """Build and hand out a snapshot if the interval passed and something changed."""
        mono = time.monotonic()
        interval = self._interval()
        if not force and mono - self._last_emit < interval:
            return None
        changed = self.model.version != self._last_version
        self._streaming = changed  # a whole interval without news ends the stream
        if not (force or changed or mono - self._last_emit >= IDLE_SNAPSHOT_S):
            return None
        snap = self.snapshot(text_every_s=TEXT_EVERY_S)
        built_s = time.monotonic() - mono
        self._last_version = snap.version
        # Never spend more than ~1/4 of this thread on snapshots (hundreds of ranks), judged on a
        # running average: one slow snapshot (the epochs verdict, every few seconds at 512 ranks)
        # must not pause the screen for four times its length.
        self._built_avg_s = built_s if self._built_avg_s is None else 0.8 * self._built_avg_s + 0.2 * built_s
        # On the interval's grid when this one is a little late (the messages gathered until it
        # was due were applied first): late snapshots would otherwise stretch every interval.
        late = mono - self._last_emit - interval
        base = mono - late if 0 <= late < interval else mono
        self._last_emit = base + max(0.0, 4 * self._built_avg_s - interval)
        if self.on_snapshot is not None:
            try:
                self.on_snapshot(snap)
            except Exception as exc:
                self._report(f"on_snapshot: {type(exc).__name__}: {exc}")
        return snap

    def _report(self, text: str) -> None:
        line = text.splitlines()[0][:200] if text else "error"
        if self.errors and self.errors[-1] == line:
            return  # a sink failing on every poll reports once, not 12 times a second
        self.errors.append(line)
        if self.on_error is not None:
            try:
                self.on_error(line)
            except Exception:
                pass
