"""How the recorded job ended, from its ranks' Byes: each rank's last word (finished, an exit
code, a signal) and the rank that failed first, so a report of a failed run says so at its top as
the headless summary did while it ran (tui.run.job_failure reads torchrun's log for the same; a
recording has only the Byes).

The first failure is the earliest Bye with an error of the rank's own, not a peer's failure seen
through a collective ("Connection closed by peer"); ranks stamp their Byes on one host clock.
A rank stopped by SIGTERM or SIGINT (Ctrl-C, ``q``, torchrun stopping the others) did not fail,
nor did it fail first where another rank's failure ended it, even if it raised earlier (as the
headless summary, from torchrun's word, says).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from tui.model.inside import inside_of
from workers.wire import protocol as p
from workers.wire.endings import ended_text, peer_failed

#: A wait inside one collective the report names (the TUI calls a rank stalled after 2 s).
LONG_WAIT_S = 2.0
#: Signals a stop sends: a rank ended by one was stopped, it did not fail.
_STOPS = {-int(signal.SIGTERM), -int(signal.SIGINT)}


def end_text(code: int) -> str:
    """``finished``, ``exit code 1`` or ``killed by SIGTERM``."""
    return "finished" if code == 0 else ended_text(code)


@dataclass(frozen=True)
class FirstFailure:
    rank: int
    code: int
    reason: str
    at_s: float  # seconds into the recording


@dataclass(frozen=True)
class Ending:
    """Per rank how it ended (``end_text`` of its last Bye); ranks without a Bye are absent."""

    by_rank: dict[int, str] = field(default_factory=dict)
    first: FirstFailure | None = None
    #: per rank its longest wait inside one collective of LONG_WAIT_S or more (its Hellos' inside)
    waits: dict[int, str] = field(default_factory=dict)
    #: times the launcher started the ranks again (torchrun --max-restarts): a rank's Hellos from
    #: more than one process; the failures before are not the job's ending, only said
    restarts: int = 0
    #: the first failure before the last restart
    before_restart: FirstFailure | None = None

    @property
    def verdict(self) -> str:
        """``failed``, ``stopped``, ``finished`` or "" (no Bye recorded)."""
        if not self.by_rank:
            return ""
        if self.first is not None:
            return "failed"
        return "finished" if all(v == "finished" for v in self.by_rank.values()) else "stopped"

    def line(self, ranks: Sequence[int]) -> str:
        """The report's one line: ``ended: ranks 0-7 finished``, ``ended: failed, rank 1 first
        (exit code 1, 0.4 s in): RuntimeError: ...; rank 0 killed by SIGTERM``; "" when no rank
        said Bye (the recording ended while the job ran)."""
        if not self.verdict:
            return ""
        rest = {r: v for r, v in self.by_rank.items() if self.first is None or r != self.first.rank}
        parts = [f"{_ranks_text(rs)} {how}" for how, rs in _by_value(rest).items()]
        silent = [r for r in ranks if r not in self.by_rank]
        if silent:
            parts.append(f"{_ranks_text(silent)} no end recorded")
        restarted = ""
        if self.restarts:
            restarted = f" (after {self.restarts} restart{'s' if self.restarts > 1 else ''}"
            before = self.before_restart
            if before is not None:
                restarted += f"; before: rank {before.rank} failed first, {before.at_s:.1f} s in"
                restarted += f": {before.reason}" if before.reason else ""
            restarted += ")"
        if self.first is None:
            return f"ended: {', '.join(parts)}{restarted}"
        f = self.first
        head = f"ended: failed, rank {f.rank} first ({end_text(f.code)}, {f.at_s:.1f} s in)"
        head += f": {f.reason}" if f.reason else ""
        return head + (f"; {', '.join(parts)}" if parts else "") + restarted


def long_waits(hellos: Sequence[tuple[int, p.Hello]]) -> dict[int, str]:
    """Per rank, the longest its Hellos saw it inside one collective, where that was LONG_WAIT_S
    or more: ``all_reduce on 0:default_pg (256 B), 12.3 s`` (a hang, or a peer that came late)."""
    longest: dict[int, tuple[float, p.Hello]] = {}
    for _, h in hellos:
        if h.inside:
            waited = h.inside_s
            if waited >= LONG_WAIT_S and waited > longest.get(h.rank, (0.0, h))[0]:
                longest[h.rank] = (waited, h)
    out = {}
    for rank, (waited, h) in sorted(longest.items()):
        op, group, nbytes, _at = inside_of(h) or ("?", "?", 0, 0.0)
        out[rank] = f"{op} on {group} ({nbytes:,} B), {waited:.1f} s"
    return out


def job_ending(byes: Sequence[tuple[int, p.Bye]], first_ns: int, hellos: Sequence[tuple[int, p.Hello]] = ()) -> Ending:
    """The :class:`Ending` of a recording's ``(recv_ns, Bye)`` list (in file order), with the
    ranks' long waits from its Hellos."""
    last: dict[int, p.Bye] = {}
    for _, bye in byes:
        last[bye.rank] = bye
    # A rank started again (torchrun --max-restarts) says Hello again, from a new process, after
    # its Bye: only Byes no later Hello of their rank follows end the job (a rank's own Bye and
    # the launcher's word on it are both its last attempt's).
    pids: dict[int, set[int]] = {}
    latest_hello: dict[int, int] = {}
    for _, h in hellos:
        pids.setdefault(h.rank, set()).add(h.pid)
        latest_hello[h.rank] = max(latest_hello.get(h.rank, 0), h.t_ns)
    failures = [b for _, b in byes if b.exit_code != 0 and b.exit_code not in _STOPS]
    final = [b for b in failures if b.t_ns >= latest_hello.get(b.rank, 0)]
    # a rank that raised and was then stopped in its teardown (torchrun stopping the others after
    # the first exit) did not fail first where another's failure ended it: the live summary's rule
    stopped = {r for r, b in last.items() if b.exit_code in _STOPS}
    final = [b for b in final if b.rank not in stopped] or final
    earlier = [b for b in failures if b.t_ns < latest_hello.get(b.rank, 0)]
    ended = {r: end_text(b.exit_code) for r, b in sorted(last.items())}
    restarts = max((len(ps) - 1 for ps in pids.values()), default=0)
    before = _first_failure(earlier, first_ns) if restarts else None
    return Ending(ended, _first_failure(final, first_ns), long_waits(hellos), restarts, before)


def _first_failure(failures: Sequence[p.Bye], first_ns: int) -> FirstFailure | None:
    """The earliest failure of a rank's own (not a peer's seen through a collective), with the
    rank's own words for it where one of its Byes has them."""
    first = min(failures, key=lambda b: (peer_failed(b.reason), b.t_ns, b.rank), default=None)
    if first is None:
        return None
    said = (b.reason for b in failures if b.rank == first.rank and _own_words(b))
    return FirstFailure(first.rank, first.exit_code, next(said, ""), (first.t_ns - first_ns) / 1e9)


def _own_words(bye: p.Bye) -> bool:
    """A reason that says more than the exit code: the rank's exception, not the launcher's
    ``exit code 3 (failed first) (reported by torchrun)``."""
    return bool(bye.reason) and not bye.reason.startswith(end_text(bye.exit_code))


def _by_value(by_rank: dict[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for rank, how in sorted(by_rank.items()):
        out.setdefault(how, []).append(rank)
    return out


def _ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``."""
    rs = sorted(ranks)
    spans: list[str] = []
    start = prev = rs[0]
    for r in [*rs[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return f"{'rank' if len(rs) == 1 else 'ranks'} {','.join(spans)}"
