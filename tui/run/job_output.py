"""Follow a job's output while it runs, from files only (never a pipe: a reader that dies must
not break the job), and write the job's log.

torchrun runs the ranks with ``--log-dir DIR --redirects 3``: each rank writes its own stdout
and stderr into ``DIR/<id>/attempt_N/<local rank>/{stdout,stderr}.log``, and torchrun's own
output goes to two more files. One thread reads every file as it grows (every
:data:`POLL_S`), gives each rank's line one prefix, ``[rank1]: `` as ``torchrun --tee`` does,
appends it to the job's log, keeps the last lines of every rank (bounded), hands it to
``on_line`` (the headless terminal), and feeds torchrun's own lines to
:class:`~tui.run.job_failure.TorchrunWords`. Why per-rank files rather than ``--tee``: the rank
comes from the file, not from parsing a prefix; stdout stays stdout and stderr stays stderr;
and there is no second hop through torchrun's tail threads.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tui.run.job_failure import (
    TRACEBACK,
    Failure,
    RankExit,
    RankOutput,
    TorchrunWords,
    exception_line,
    explain,
    without_own_prefix,
)
from tui.run.log_store import JobLogPaths

#: How often the files are read (the passthrough's and the status line's latency).
POLL_S = 0.05
#: Once ranks' files were found, look for more (a late rank, a restart) every this many reads.
DISCOVER_EVERY = 10
#: A line longer than this is cut into pieces (at a UTF-8 character's start).
MAX_LINE = 16384
_RANK_FILE = re.compile(r"attempt_(\d+)/(\d+)/std(out|err)\.log$")


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """(whole lines, the line still being written) of ``data``. Of a line a progress bar rewrites
    with ``\\r`` only the latest state is kept (tqdm's never ends before the bar does: it was cut
    into 16 KiB fragments); a line longer than MAX_LINE is cut into pieces, each at a UTF-8
    character's start (a character split in two showed as two replacement marks)."""
    *lines, partial = data.split(b"\n")
    rewritten = partial.rfind(b"\r", 0, len(partial) - 1)  # a last "\r" may be a "\r\n" half-read
    if rewritten >= 0:
        partial = partial[rewritten + 1 :]
    out: list[bytes] = []
    for line in lines:
        while len(line) > MAX_LINE:
            cut = _char_start(line, MAX_LINE)
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    while len(partial) > MAX_LINE:
        cut = _char_start(partial, MAX_LINE)
        out.append(partial[:cut])
        partial = partial[cut:]
    return out, partial


def _text(rank: int | None, raw: bytes) -> str:
    """A line as shown: decoded, a progress bar redrawn in place at its last state, a rank's
    own ``[rankN]:`` prefix (torchrun --tee in the job) not doubled."""
    text = raw.decode(errors="replace").rstrip()
    text = text.rsplit("\r", 1)[-1]
    return text if rank is None else without_own_prefix(rank, text)


def _whole_chars(data: bytes) -> bytes:
    """``data`` without a UTF-8 character still being written at its end."""
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            return data[: exc.start]
    return data


def _char_start(data: bytes, at: int) -> int:
    """``at``, or the start of the UTF-8 character it falls inside (continuation bytes are 10xxxxxx)."""
    back = at
    while back > at - 3 and back > 0 and data[back] & 0xC0 == 0x80:
        back -= 1
    return back


@dataclass(frozen=True)
class JobLine:
    """One line of the job's output."""

    #: the rank that printed it; None: torchrun's own line
    rank: int | None
    err: bool
    text: str

    def shown(self) -> str:
        """The line as the log and the terminal show it: ``[rank1]: text``."""
        return self.text if self.rank is None else f"[rank{self.rank}]: {self.text}"


@dataclass
class _Followed:
    path: Path
    rank: int | None
    err: bool
    fh: BinaryIO
    partial: bytes = b""
    attempt: int = 0  # torchrun's attempt (a restart writes into attempt_1, ...)


class JobOutput:
    """Reads a job's output files on its own thread until ``ended()`` and every file is read to
    its end; the job's log, the last lines of every rank, torchrun's words."""

    def __init__(
        self,
        paths: JobLogPaths,
        ended: Callable[[], bool],
        *,
        on_line: Callable[[JobLine], None] | None = None,
        tail_lines: int = 200,
    ) -> None:
        self.paths = paths
        self._ended = ended
        self.on_line = on_line
        self._tail_lines = tail_lines
        self._lock = threading.Lock()
        self._all: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._torchrun: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._rank_lines: dict[int, collections.deque[str]] = {}
        #: stderr only, longer: a traceback must fit
        self._rank_err: dict[int, collections.deque[str]] = {}
        self._traceback_seen: dict[int, int] = {}
        #: (rank, stderr) -> the line it is writing now (a progress bar's latest state)
        self._writing: dict[tuple[int, bool], str] = {}
        #: rank -> the newest attempt it wrote in (torchrun --max-restarts starts the ranks again)
        self._attempt: dict[int, int] = {}
        self.words = TorchrunWords()
        self._followed: dict[Path, _Followed] = {}
        self._reads = 0
        self.log_error = ""
        self._log: BinaryIO | None = None
        self._thread = threading.Thread(target=self._run, name="job-output", daemon=True)

    def start(self) -> None:
        try:
            # A new run's log replaces one left at the same path, as its recording does ("wb").
            self._log = open(self.paths.log, "wb")  # noqa: SIM115 - closed by the thread at the end
        except OSError as exc:
            self.log_error = f"cannot write the job's log {self.paths.log}: {exc.strerror or exc}"
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def done(self) -> bool:
        """Whether every file was read to its end after the job ended."""
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while True:
                ended = self._ended()  # before reading: what it wrote is in the files
                if not self._read_all(everything=ended) and ended:
                    break
                if not ended:
                    time.sleep(POLL_S)
            for f in self._followed.values():
                if f.partial:
                    self._take(f, f.partial)
                    f.partial = b""
            with self._lock:
                self._writing.clear()
            self._flush()
        finally:
            for f in self._followed.values():
                f.fh.close()
            if self._log is not None:
                self._log.close()

    def _discover(self, everything: bool) -> None:
        own = [(self.paths.torchrun_stdout, False), (self.paths.torchrun_stderr, True)]
        found: list[tuple[Path, int | None, bool, int]] = [(p, None, err, 0) for p, err in own]
        ranks_seen = len(self._followed) > len(own)
        if self.paths.ranks_dir.is_dir() and (everything or not ranks_seen or self._reads % DISCOVER_EVERY == 0):
            # stdout before stderr: lines read in one pass come in that order (the files keep no
            # times), so a rank's last prints come before the traceback it ended with.
            paths = self.paths.ranks_dir.glob("*/attempt_*/*/std*.log")
            for path in sorted(paths, key=lambda path: (path.parent.as_posix(), path.name != "stdout.log")):
                m = _RANK_FILE.search(path.as_posix())
                if m:
                    found.append((path, int(m.group(2)), m.group(3) == "err", int(m.group(1))))
        for path, rank, err, attempt in found:
            if path in self._followed:
                continue
            try:
                fh = open(path, "rb")  # noqa: SIM115 - closed at the end of the thread
            except OSError:
                continue
            self._followed[path] = _Followed(path, rank, err, fh, attempt=attempt)

    def _read_all(self, everything: bool = False) -> bool:
        """One pass over every file (``everything``: look for new files now); whether anything was read."""
        self._discover(everything)
        got = False
        for f in list(self._followed.values()):
            read = False
            while chunk := f.fh.read(65536):
                read = got = True
                lines, f.partial = split_lines(f.partial + chunk)
                for raw in lines:
                    self._take(f, raw)
            if read and f.rank is not None:  # its line being written changed only if it wrote
                self._note_writing(f)
        self._reads += 1
        if got:
            self._flush()
        return got

    def _note_writing(self, f: _Followed) -> None:
        """Keep the line the rank is writing now (a tqdm bar ends its line only when the bar is
        done: until then the log pane shows its latest state, as a terminal would)."""
        assert f.rank is not None
        text = _text(f.rank, _whole_chars(f.partial)) if f.partial.strip() else ""
        with self._lock:
            if text.strip():
                self._writing[(f.rank, f.err)] = text
            else:
                self._writing.pop((f.rank, f.err), None)

    def _take(self, f: _Followed, raw: bytes) -> None:
        text = _text(f.rank, raw)
        line = JobLine(f.rank, f.err, text)
        shown = line.shown()
        with self._lock:
            self._all.append(shown)
            if f.rank is None:
                self._torchrun.append(text)
            else:
                if f.attempt > self._attempt.get(f.rank, 0):  # started again: its error is the new attempt's
                    self._rank_err.pop(f.rank, None)
                    self._traceback_seen.pop(f.rank, None)
                self._attempt[f.rank] = max(f.attempt, self._attempt.get(f.rank, 0))
                self._rank_lines.setdefault(f.rank, collections.deque(maxlen=self._tail_lines)).append(text)
                if f.err:
                    self._rank_err.setdefault(f.rank, collections.deque(maxlen=2 * self._tail_lines)).append(text)
                    if text.strip() == TRACEBACK:
                        self._traceback_seen.setdefault(f.rank, self._reads)
            if f.rank is None:
                self.words.feed(text)
        if self._log is not None:
            try:
                self._log.write(shown.encode() + b"\n")
            except OSError as exc:
                self.log_error = f"the job's log {self.paths.log} stopped: {exc.strerror or exc}"
                self._log = None
        if self.on_line is not None:
            try:
                self.on_line(line)
            except Exception:  # noqa: BLE001 - a terminal gone away: stop passing through, keep reading
                self.on_line = None

    def _flush(self) -> None:
        if self._log is not None:
            try:
                self._log.flush()
            except OSError as exc:
                self.log_error = f"the job's log {self.paths.log} stopped: {exc.strerror or exc}"
                self._log = None

    # ------------------------------------------------------------------ readers (any thread)

    def lines(self) -> list[str]:
        """The last lines of the job, every rank's and torchrun's, as shown."""
        with self._lock:
            return list(self._all)

    def writing(self) -> dict[int, list[str]]:
        """rank -> the lines it is writing now, not ended yet (stdout's, then stderr's)."""
        with self._lock:
            out: dict[int, list[str]] = {}
            for (rank, _err), text in sorted(self._writing.items()):
                out.setdefault(rank, []).append(text)
            return out

    @property
    def restarts(self) -> int:
        """How many times torchrun started the ranks again (its newest attempt's number)."""
        with self._lock:
            return max(self._attempt.values(), default=0)

    def torchrun_lines(self) -> list[str]:
        with self._lock:
            return list(self._torchrun)

    def rank_lines(self) -> dict[int, list[str]]:
        """rank -> its last lines (stdout and stderr as read)."""
        with self._lock:
            return {rank: list(lines) for rank, lines in sorted(self._rank_lines.items())}

    def outputs(self) -> dict[int, RankOutput]:
        with self._lock:
            ranks = set(self._rank_err) | set(self._rank_lines)
            return {
                r: RankOutput(r, list(self._rank_err.get(r, ())), self._traceback_seen.get(r)) for r in sorted(ranks)
            }

    def exits(self) -> dict[int, RankExit]:
        """rank -> how it ended, by torchrun's word (tui.run.job_failure.TorchrunWords)."""
        with self._lock:
            return self.words.exits

    def pid_exits(self) -> dict[int, int]:
        with self._lock:
            return self.words.pid_exits()

    def failure(self, code: int, failing_byes: dict[int, tuple[int, str]]) -> Failure:
        """Why the job failed, from what was read so far (see tui.run.job_failure.explain)."""
        return explain(code, self.exits(), self.outputs(), failing_byes, self.torchrun_lines())

    def rank_error(self, rank: int) -> str:
        """The rank's last exception line ("" if none)."""
        out = self.outputs().get(rank)
        return exception_line(out.err) if out is not None else ""
