"""What `commtop run --headless` writes while the job runs: the job's own lines as they come
(a rank's stdout to stdout, its stderr to stderr, each with its ``[rankN]: `` prefix), and on a
terminal one progress line rewritten in place (``\\r``, at most twice a second), nothing of it
when the output goes to a pipe or a file.

torchrun's ChildFailedError traceback and summary are left out here (they stay in the job's
log): commtop says at the end which rank failed first and why, in the rank's own words. So is
the SignalException traceback torchrun prints when commtop stops the job (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

from tui.model.inside import inside_of
from tui.model.run_model import RunModel
from tui.run.job_output import JobLine

#: The progress line is rewritten at most this often.
PROGRESS_EVERY_S = 0.5
_CLEAR = "\r\x1b[K"


class HeadlessTerminal:
    """One writer for the job's lines (output thread) and the progress line (main thread)."""

    def __init__(self, out: TextIO, err: TextIO, *, progress: bool | None = None, ranks_stdout: bool = True) -> None:
        self.out = out
        self.err = err
        #: pass the ranks' stdout through (commtop's own loop prints only a machine-readable
        #: summary there, which the summary table replaces: its stderr alone is passed)
        self.ranks_stdout = ranks_stdout
        self.progress_on = progress if progress is not None else _is_tty(out) and _is_tty(err)
        self._lock = threading.Lock()
        self._progress = ""
        self._held: list[JobLine] = []  # a torchrun traceback, until it is known to be its wrapper
        self._gone: set[int] = set()  # ids of streams whose reader left (``| head``): written no more
        self._skipping = 0  # inside torchrun's failure summary: "=" borders still to pass

    # ------------------------------------------------------------------ the job's lines

    def line(self, line: JobLine) -> None:
        """Pass one line of the job through (any thread)."""
        with self._lock:
            for shown in self._filter(line):
                self._write(self.err if shown.err else self.out, shown.shown())

    def _filter(self, line: JobLine) -> list[JobLine]:
        """torchrun's own traceback is held until its exception: its ChildFailedError wrapper
        (and the summary after it) is dropped, anything else is passed on."""
        if line.rank is not None:
            return [line] if line.err or self.ranks_stdout else []
        text = line.text
        if self._skipping:
            if text and set(text) == {"="}:
                self._skipping -= 1
            return []
        if self._held:
            self._held.append(line)
            if text and not text.startswith((" ", "\t")):  # the traceback's exception line
                held, self._held = self._held, []
                if "ChildFailedError" in text:
                    self._skipping = 2  # the summary's top and bottom borders
                    return []
                if "SignalException" in text:  # torchrun got the SIGTERM with which commtop stops the job
                    return []
                return held
            return []
        if text.strip() == "Traceback (most recent call last):":
            self._held = [line]
            return []
        return [line]

    def _write(self, stream: TextIO, text: str) -> None:
        if self._progress:
            self._raw(self.err, _CLEAR)
        self._raw(stream, text + "\n")
        if self._progress:
            self._raw(self.err, self._progress)

    def _raw(self, stream: TextIO, text: str) -> None:
        if id(stream) in self._gone:
            return
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:  # its reader left (``commtop run ... | head``): the other stream goes on
            self._gone.add(id(stream))

    # ------------------------------------------------------------------ progress

    def progress(self, text: str, job_line: str = "") -> None:
        """Rewrite the progress line (main thread; the caller keeps to PROGRESS_EVERY_S):
        ``job_line`` first, the line a rank is still writing (a tqdm bar, which ends its line
        only when done: it would not show at all until then), then commtop's ``text``. Cut to
        the terminal's width: a line that wraps is not rewritten in place by ``\r``."""
        if not self.progress_on:
            return
        line = f"{job_line} │ {text}" if job_line else text
        width = _width(self.err)
        if len(line) >= width:
            line = line[: max(1, width - 2)] + "…"
        with self._lock:
            self._progress = line
            self._raw(self.err, _CLEAR + line)

    def close(self) -> None:
        """Clear the progress line and pass on what is still held."""
        with self._lock:
            held, self._held = self._held, []
            for line in held:
                self._write(self.err if line.err else self.out, line.shown())
            if self._progress:
                self._raw(self.err, _CLEAR)
                self._progress = ""


#: Stalled ranks the progress line names before "+N more".
STALLED_SHOWN = 4


class Progress:
    """The progress line's text from the model: steps (a user's job) or iterations, their
    rate, the ranks that reported, elapsed time."""

    def __init__(self, model: RunModel, expected_ranks: int, started: float | None = None) -> None:
        self.model = model
        self.expected = expected_ranks
        self.started = time.monotonic() if started is None else started
        self._samples: list[tuple[float, int]] = []
        self._next = 0.0

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + PROGRESS_EVERY_S
        return True

    def text(self, now: float) -> str:
        ranks = list(self.model.ranks.values())
        world = max([self.expected, *(r.hello.world_size for r in ranks if r.hello is not None)])
        elapsed = _clock(now - self.started)
        said = sum(1 for r in ranks if r.hello is not None or r.received)
        last = max((r.last_iteration for r in ranks), default=-1)
        if last < 0:
            return f"commtop: starting · ranks {said}/{world} · {elapsed}"
        unit, units = "iteration", "it"
        if any(r.hello is not None and r.hello.config.get("source") == "monitor" for r in ranks):  # a user's job
            step = max((s for s in (r.steps.latest() for r in ranks) if s is not None), default=0)
            unit, units = ("step", "steps") if step > 0 else ("collective", "collectives")  # step 0: none marked yet
            last = step if step > 0 else last
        self._samples = [(t, i) for t, i in self._samples if now - t <= 5.0] + [(now, last)]
        t0, i0 = self._samples[0]
        rate = f" · {(last - i0) / (now - t0):.1f} {units}/s" if now - t0 >= 1.0 else ""
        return f"commtop: {unit} {last}{rate} · ranks {said}/{world} · {elapsed}{self._stalled()}"

    def _stalled(self) -> str:
        """ " · stalled: rank 0 inside all_reduce 12s, rank 1": ranks whose heartbeat goes on and
        whose collectives stopped (a hang names where each rank is; tui.model.inside)."""
        model = self.model
        now = model.clock()
        out = []
        for r in sorted(model.ranks.values(), key=lambda r: r.rank):
            if not r.received or r.bye is not None or now - r.last_seen_ns > model.stale_after_ns:
                continue
            if now - r.last_record_ns > model.stale_after_ns:
                inside = inside_of(r.hello)
                out.append(f"rank {r.rank} inside {inside[0]} {inside[3]:.0f}s" if inside else f"rank {r.rank}")
        if not out:
            return ""
        more = f", +{len(out) - STALLED_SHOWN} more" if len(out) > STALLED_SHOWN else ""
        return " · stalled: " + ", ".join(out[:STALLED_SHOWN]) + more


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _width(stream: TextIO, default: int = 200) -> int:
    """The terminal's width in columns (``default`` where it cannot be read)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or default
    except (AttributeError, ValueError, OSError):
        return default


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
