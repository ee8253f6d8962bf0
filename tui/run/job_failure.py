"""Why a job failed, from what its ranks and torchrun printed: which rank failed first, its own
error (the exception, not torchrun's ChildFailedError wrapper), and how every other rank ended.

torchrun's own "Root Cause (first observed failure)" is not enough: it polls its workers every
``--monitor-interval`` and stamps failures with whole seconds, so when a rank raises and its
peer dies of the broken collective before the next poll, it names the lowest rank (seen with
gloo: rank 0's "Connection closed by peer" named, rank 1's ValueError not). Here the first
failing rank is, among the ranks that failed on their own (not stopped by torchrun), the one
whose error is not a peer's failure seen through the collective ("Connection closed by peer"),
then the one that said Bye with an error first (ranks stamp their Bye on one host clock), then
the one whose traceback came first in the log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from workers.wire.endings import cut_between_words, ended_text, peer_failed

#: torchrun's agent, when it stops the other workers: "Sending process 123 closing signal SIGTERM".
_CLOSING = re.compile(r"Sending process (\d+) closing signal (SIG[A-Z]+)")
#: torchrun's agent, at the first failure it sees: "failed (exitcode: -9) local_rank: 1 (pid: 123)".
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
#: torchrun's ChildFailedError summary, one block per failed worker: "rank : 1 (local_rank: 1)"
#: then "exitcode : -9 (pid: 123)".
_SUMMARY_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: (\d+)\)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*: (-?\d+) \(pid: (\d+)\)")
#: C++ source locations that torch, gloo and NCCL errors start with: "[/src/gloo/.../pair.cc:553] ".
_SOURCE = re.compile(r"\[[^\]\s]*[/\\][^\]\s]*:\d+\]\s*")
#: How commtop's own one-line notices in a rank's output begin (the capture's, the monitor's).
_COMMTOP_NOTICE = ("commtop: ", "commtop monitor", "commtop capture")
#: Frames a traceback shows because commtop started the script (the capture bootstrap runs it
#: through runpy; the monitor wraps torch.distributed's calls).
_COMMTOP_FRAME = re.compile(r'File "(<frozen runpy>|[^"]*workers/(capture/bootstrap|monitor/patch)\.py)"')
TRACEBACK = "Traceback (most recent call last):"
#: Lines of a traceback shown: its first line, then the last ones (the exception is last).
TRACEBACK_LINES = 10


@dataclass(frozen=True)
class RankExit:
    """How one worker ended, as torchrun saw it."""

    rank: int
    code: int
    pid: int
    #: torchrun sent it a closing signal because another worker had failed
    stopped: bool = False


class TorchrunWords:
    """What torchrun's agent says about its workers, fed its own output line by line."""

    def __init__(self) -> None:
        #: pids torchrun sent a closing signal to
        self.stopped_pids: set[int] = set()
        self._first: dict[int, RankExit] = {}  # the first-failure line, by local rank
        self._summary: dict[int, RankExit] = {}  # the ChildFailedError summary, by rank
        self._rank: int | None = None

    @property
    def exits(self) -> dict[int, RankExit]:
        """rank -> how it ended: from torchrun's failure summary, or, until it comes, from the
        first failure torchrun saw (named by local rank: the same on one node)."""
        chosen = self._summary or self._first
        return {r: RankExit(e.rank, e.code, e.pid, e.pid in self.stopped_pids) for r, e in chosen.items()}

    def feed(self, line: str) -> None:
        if m := _CLOSING.search(line):
            self.stopped_pids.add(int(m.group(1)))
        elif m := _FAILED.search(line):
            code, local, pid = int(m.group(1)), int(m.group(2)), int(m.group(3))
            self._first.setdefault(local, RankExit(local, code, pid))
        elif m := _SUMMARY_RANK.match(line):
            self._rank = int(m.group(1))
        elif (m := _SUMMARY_EXIT.match(line)) and self._rank is not None:
            self._summary[self._rank] = RankExit(self._rank, int(m.group(1)), int(m.group(2)))
            self._rank = None

    def pid_exits(self) -> dict[int, int]:
        """pid -> exit code of every worker torchrun saw end with an error."""
        return {e.pid: e.code for e in (*self._first.values(), *self._summary.values())}


@dataclass(frozen=True)
class RankOutput:
    """What one rank printed, as much as is kept: its stderr's last lines, and when (in the
    order the log was read) its first traceback appeared."""

    rank: int
    err: Sequence[str]
    #: index of the read that first saw a traceback of this rank (None: none seen)
    traceback_seen: int | None = None


def last_traceback(err: Sequence[str]) -> list[str]:
    """The last traceback in ``err`` (its first line, then the last lines up to the exception),
    without commtop's own frames (the capture bootstrap, runpy, the monitor's wrapper), or the
    last lines when there is none."""
    starts = [i for i, ln in enumerate(err) if ln.strip() == TRACEBACK]
    if not starts:  # commtop's own notices in the rank's stderr are not the rank's error
        return [ln for ln in err if ln.strip() and not ln.startswith(_COMMTOP_NOTICE)][-3:]
    # commtop's notices printed after it (the monitor's end lines) are not the rank's error either
    block = _without_commtop_frames(
        [ln for ln in err[starts[-1] :] if ln.strip() and not ln.startswith(_COMMTOP_NOTICE)]
    )
    if len(block) > TRACEBACK_LINES + 1:
        block = [block[0], "  ...", *block[-TRACEBACK_LINES:]]
    return block


def _without_commtop_frames(block: list[str]) -> list[str]:
    """A traceback's frames that are the user's and torch's: a frame is its ``  File "..."`` line
    and the deeper-indented lines under it."""
    out: list[str] = []
    skipping = False
    for line in block:
        if line.startswith('  File "'):
            skipping = _COMMTOP_FRAME.search(line) is not None
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            out.append(line)
    return out


def exception_line(err: Sequence[str]) -> str:
    """The exception of the last traceback ("ValueError: boom"), C++ source locations cut; ""
    without a traceback (a rank's last line is then anything it printed: a framework's tip read
    as the error of a rank torchrun stopped)."""
    if not any(ln.strip() == TRACEBACK for ln in err):
        return ""
    block = last_traceback(err)
    for line in reversed(block):
        if line.strip() and not line.startswith((" ", "\t")) and line.strip() != TRACEBACK:
            return cut_between_words(_SOURCE.sub("", line.strip()), 200)
    return ""


@dataclass(frozen=True)
class Failure:
    """Why the job failed: the explanation's lines, the first failing rank's error last."""

    first: int | None
    #: rank -> one line on how it ended ("killed by SIGTERM (stopped by torchrun after rank 1 failed)")
    ended: dict[int, str]
    lines: list[str]


def explain(
    code: int,
    exits: dict[int, RankExit],
    outputs: dict[int, RankOutput],
    failing_byes: dict[int, tuple[int, str]],
    torchrun_tail: Sequence[str],
) -> Failure:
    """The lines that say why a job whose torchrun exited with ``code`` failed.

    ``failing_byes``: rank -> (time in ns, reason) of a Bye that carried an error. The last lines
    are the first failing rank's own error with its rank; before them, one line per other rank."""
    first = first_failure(exits, outputs, failing_byes)
    ended: dict[int, str] = {}
    others = set(exits) or {r for r, o in outputs.items() if o.traceback_seen is not None}
    for rank in sorted(others):
        if rank == first:
            continue
        e = exits.get(rank)
        after = f"after rank {first} failed" if first is not None else ""
        out = outputs.get(rank)
        own = exception_line(out.err) if out is not None else ""  # its traceback's exception
        if e is not None and e.stopped and not own:
            ended[rank] = f"{ended_text(e.code)} (stopped by torchrun{' ' + after if after else ''})"
        else:  # its own error, also where torchrun's stop came after it (the error says more)
            what = own or failing_byes.get(rank, (0, ""))[1]
            how = ended_text(e.code) if e is not None else "failed"
            if not what:
                ended[rank] = f"{how} {after}".rstrip()
            elif after and peer_failed(what):  # the first rank's failure, seen: the error is this rank's
                ended[rank] = f"{how} {after}; its error: {what}"
            else:  # an error of its own (both ranks' bad backend name): not caused, only later
                ended[rank] = f"{how}: {what}"
    lines = [f"rank {rank}: {text}" for rank, text in sorted(ended.items())]
    if first is None:
        tail = [ln for ln in torchrun_tail if ln.strip()][-8:]
        lines += ["torchrun's last lines:", *(f"  {ln}" for ln in tail)] if tail else []
        return Failure(None, ended, lines)
    e = exits.get(first)
    out = outputs.get(first)
    how = ended_text(e.code) if e is not None else "failed"
    ended[first] = f"{how} (failed first)"
    block = last_traceback(out.err) if out is not None else []
    if (e is not None and e.code < 0) or not block:
        lines.append(f"rank {first} failed first: {how}")
    else:
        lines.append(f"rank {first} failed first ({how}):")
    lines += [f"  [rank{first}]: {ln}" for ln in block]
    return Failure(first, ended, lines)


def first_failure(
    exits: dict[int, RankExit], outputs: dict[int, RankOutput], failing_byes: dict[int, tuple[int, str]]
) -> int | None:
    """The rank that failed first (see the module's docstring), or None if no rank failed."""
    failed = [r for r, e in exits.items() if e.code != 0]
    candidates = [r for r in failed if not exits[r].stopped] or failed
    if not candidates:  # no summary from torchrun (it was killed, or a command run as given)
        candidates = [r for r, o in outputs.items() if o.traceback_seen is not None]
    if not candidates:
        return None

    def key(rank: int) -> tuple[bool, float, float, int]:
        out = outputs.get(rank)
        bye_ns, bye_reason = failing_byes.get(rank, (math.inf, ""))
        error = f"{exception_line(out.err) if out is not None else ''} {bye_reason}"
        seen = out.traceback_seen if out is not None and out.traceback_seen is not None else math.inf
        return (peer_failed(error), bye_ns, seen, rank)

    return min(candidates, key=key)


def without_own_prefix(rank: int, text: str) -> str:
    """A rank's line without torch's own ``[rankN]: `` (its excepthook prefixes tracebacks), so
    that the line carries one prefix, commtop's."""
    own = f"[rank{rank}]:"
    if text.startswith(own):
        return text[len(own) :].removeprefix(" ")
    return text


def torchrun_lines(lines: Iterable[str]) -> TorchrunWords:
    """torchrun's words from all of its lines at once (tests, a log read back)."""
    words = TorchrunWords()
    for line in lines:
        words.feed(line)
    return words
