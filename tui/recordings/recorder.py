"""The live recorder: the collector's Sink that writes what it accepts to a recording.

``write`` (on the ingest thread) only appends to a bounded in-memory list; a writer thread
encodes and writes a chunk every few seconds, or sooner once enough records wait
(:mod:`tui.recordings.writer`)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from tui.ingest.interfaces import RecordingStatus
from tui.recordings.codec import FORMAT_VERSION
from tui.recordings.version import tool_version
from tui.recordings.writer import RecordingWriter, default_path, run_metadata
from workers.wire import protocol as p
from workers.wire.config import seconds_in_range

CLOCK_SOURCE = "time.time_ns (CLOCK_REALTIME) per host; GPU events anchored"
#: How long what was received may wait before it is on disk (what a SIGKILLed collector can
#: lose). Reading pays per chunk (unpack, checks, a slice per byte plane), so few large chunks
#: read faster: 10 M records of an 8-rank forum loop in 0.9 s chunks took ``commtop report``
#: 2.9 s on the VM, in 5 s chunks 2.2 s (and 9.0 bytes a record instead of 9.8).
FLUSH_S = 4.0
#: Overrides FLUSH_S (seconds, 0.05-10): less to lose to a SIGKILL, slower to read.
FLUSH_ENV = "COMMTOP_RECORD_FLUSH_S"
#: Records that start a chunk before ``FLUSH_S`` is up (a busy run: the memory bound holds and
#: a chunk stays a few MB).
CHUNK_RECORDS = 262_144


def run_label(hellos: Mapping[int, p.Hello]) -> str:
    """What ran, for a file name: the collective of commtop's loop ("all_gather"), the script's
    name of a user's job ("train_ddp"); "" before any Hello."""
    for _, hello in sorted(hellos.items()):
        what = str(hello.config.get("collective") or "")
        if hello.config.get("source") == "monitor" or what.startswith("monitor: "):
            script = what.removeprefix("monitor:").strip().split(" ")[0]
            return Path(script).stem or "monitor"
        if what:
            return what
    return ""


def flush_s_from_env(env: Mapping[str, str] = os.environ) -> float:
    """FLUSH_S, or ``$COMMTOP_RECORD_FLUSH_S``; a value that is not seconds in 0.05-10 is said in
    one line on stderr and the default kept (a recording is never refused for it)."""
    text = env.get(FLUSH_ENV, "").strip()
    if not text:
        return FLUSH_S
    value = seconds_in_range(text, 0.05, 10.0)
    if value is None:
        print(
            f"commtop: {FLUSH_ENV}={text!r} is not seconds in 0.05-10; recording in {FLUSH_S:g} s chunks",
            file=sys.stderr,
        )
        return FLUSH_S
    return value


class Recorder:
    """The collector's Sink that records: ``r`` in the TUI, ``--record`` on the command line.

    ``write`` (ingest thread) appends to a bounded list and returns; a writer thread turns
    that list into a chunk every ``flush_s`` (default FLUSH_S, or ``$COMMTOP_RECORD_FLUSH_S``) or
    once ``chunk_records`` wait. When the disk fails (ENOSPC,
    EIO) recording stops, ``status().error`` says why, and the live view goes on.
    """

    def __init__(
        self,
        collective: str = "run",
        directory: str | os.PathLike[str] = "recordings",
        *,
        flush_s: float | None = None,
        chunk_records: int = CHUNK_RECORDS,
        max_pending_records: int = 2_000_000,
        max_pending_messages: int = 200_000,
        opener: Callable[[str, str], IO[bytes]] | None = None,
        level: int = 6,
    ) -> None:
        self.collective = collective
        self.directory = directory
        self.flush_s = min(flush_s if flush_s is not None else flush_s_from_env(), 10.0)
        self.chunk_records = chunk_records
        self._due = threading.Event()  # enough records wait (or stop): write a chunk now
        self.max_pending_records = max_pending_records
        self.max_pending_messages = max_pending_messages
        self._opener = opener or (lambda path, mode: open(path, mode))  # noqa: SIM115
        self._level = level
        self._lock = threading.Lock()
        self._pending: list[tuple[int, Any]] = []
        self._pending_records = 0
        self._hellos: dict[int, p.Hello] = {}
        self._caps: dict[str, Any] = {}
        self._active = False
        self._path = ""
        self._started = 0.0
        #: (label, wall-clock start) of a file named before any Hello said what runs: renamed
        #: after what ran when the recording ends (``commtop watch --record``).
        self._provisional: tuple[str, float] | None = None
        #: Every recording this recorder finished, in order (``r`` stops one and starts another).
        self.saved: list[str] = []
        self._error = ""
        self._lost = 0
        self._writer: RecordingWriter | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- Sink (ingest thread)
    def write(self, message: p.Message) -> None:
        if isinstance(message, p.Hello):
            self._hellos[message.rank] = message
        elif isinstance(message, dict) and message.get("k") == p.TELEM_CAPS:
            self._caps[str(message.get("host", ""))] = message
        if not self._active:
            return
        n = len(message) if isinstance(message, p.Batch) else 1
        with self._lock:
            if self._pending_records + n > self.max_pending_records or len(self._pending) >= self.max_pending_messages:
                self._lost += 1
                return
            self._pending.append((time.time_ns(), message))
            self._pending_records += n
            full = self._pending_records >= self.chunk_records
        if full:
            self._due.set()

    # ---- RecorderLike
    def start(self, path: str | None = None) -> str:
        """Start recording to ``path`` (default under ``recordings/``); returns the path.
        A file that cannot be opened leaves the recorder stopped with ``status().error`` set."""
        if self._active:
            return self._path
        if self._thread is not None:
            self._thread.join()
        label = run_label(self._hellos) or self.collective
        started_wall = time.time()
        if path:  # later recordings of this session (r) go where the user put this one
            self.directory = Path(path).parent
        target = Path(path) if path else default_path(self.directory, label, now=started_wall)
        self._provisional = (label, started_wall) if not path and not run_label(self._hellos) else None
        self._path = str(target)
        self._error = ""
        self._lost = 0
        meta = {
            "tool": "commtop",
            "tool_version": tool_version(),
            "schema_version": p.SCHEMA_VERSION,
            "format_version": FORMAT_VERSION,
            "clock": CLOCK_SOURCE,
            "created_ns": time.time_ns(),
            "recorder_host": socket.gethostname(),
            "recorder_pid": os.getpid(),
            **run_metadata(dict(self._hellos), dict(self._caps)),
        }
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            self._writer = RecordingWriter(self._opener(str(target), "wb"), meta, level=self._level)
            self._writer.flush()
        except OSError as exc:
            self._error = f"cannot record to {target}: {exc.strerror or exc}"
            self._writer = None
            return self._path
        now = time.time_ns()
        with self._lock:  # start with what a reader needs: every rank's Hello, the node caps
            self._pending = [(now, h) for _, h in sorted(self._hellos.items())]
            self._pending += [(now, c) for c in self._caps.values()]
            self._pending_records = 0
            self._active = True
        self._started = time.monotonic()
        self._stop.clear()
        self._due.clear()
        self._thread = threading.Thread(target=self._run, name="commtop-recorder", daemon=True)
        self._thread.start()
        return self._path

    def stop(self) -> None:
        """Write what is buffered and the trailer, then close the file (and name it after what
        ran, when that was not known as it started)."""
        self._active = False
        self._stop.set()
        self._due.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        writer = self._writer
        # no rank said anything (no Hello, no record written): a job that never started
        if writer is not None and not self._hellos and not writer.records:
            self._writer = None
            self._remove_empty()
            return
        self._name_after_run()
        if writer is not None and self._path not in self.saved:
            self.saved.append(self._path)

    def _remove_empty(self) -> None:
        """A recording of no rank holds nothing to report or replay (a node's telemetry at
        most): it goes, with one line, rather than piling up under ``recordings/`` (a job that
        never started keeps its log, which says why)."""
        path, self._provisional = self._path, None
        try:
            os.remove(path)
        except OSError:
            return
        print(f"commtop: no rank reported anything, so the empty recording {path} was removed", file=sys.stderr)

    def _name_after_run(self) -> None:
        provisional, self._provisional = self._provisional, None
        label = run_label(self._hellos)
        if provisional is None or not label or label == provisional[0] or not os.path.exists(self._path):
            return
        target = default_path(Path(self._path).parent, label, now=provisional[1])
        try:
            os.rename(self._path, target)
        except OSError as exc:
            print(f"commtop: recording kept as {self._path} (cannot rename it: {exc.strerror or exc})", file=sys.stderr)
            return
        self._path = str(target)
        print(f"commtop: recording saved as {target}", file=sys.stderr)

    close = stop

    def status(self) -> RecordingStatus:
        writer = self._writer
        error = self._error
        if not error and self._lost:
            error = f"recording fell behind: {self._lost} messages not recorded"
        return RecordingStatus(
            active=self._active,
            path=self._path,
            bytes_written=writer.bytes_written if writer else 0,
            elapsed_s=time.monotonic() - self._started if self._active else 0.0,
            error=error,
        )

    # ---- writer thread
    def _take(self) -> list[tuple[int, Any]]:
        with self._lock:
            items, self._pending, self._pending_records = self._pending, [], 0
        return items

    def _run(self) -> None:
        writer = self._writer
        assert writer is not None
        try:
            while True:
                self._due.wait(self.flush_s)
                self._due.clear()
                stopping = self._stop.is_set()
                items = self._take()
                for i in range(0, len(items), 20_000):  # bounded chunk size
                    writer.write_chunk(items[i : i + 20_000])
                writer.flush()
                if stopping:
                    hellos = dict(self._hellos)
                    writer.close({"complete": True, "lost_messages": self._lost, **run_metadata(hellos, self._caps)})
                    return
        except Exception as exc:  # ENOSPC, EIO, ...: stop recording, never the run
            reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
            self._error = f"{reason}: recording stopped"
            self._active = False
            self._take()
            writer.abort()
            print(f"commtop: recording to {self._path} stopped: {reason}", file=sys.stderr)
