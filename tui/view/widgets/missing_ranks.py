"""The status lines that say ranks are missing, and why they may be: before, a job whose ranks
never reached the collector showed ``ranks 0/2`` and nothing else, for ever."""

from __future__ import annotations

import time
from collections.abc import Callable

from tui.model.snapshot import Snapshot

#: Seconds without a hello from some rank before the status line says so (a loaded machine takes
#: several seconds to import torch and start the ranks).
NO_HELLO_S = 15.0


class MissingRanks:
    """Says, after :data:`NO_HELLO_S`, that no rank (or not every rank) has said hello, and what to
    check. ``watch``: the ranks are started by hand (`commtop watch`), so the connection file, the
    key, the endpoint and how the script is started are the likely causes."""

    def __init__(self, *, watch: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.watch = watch
        self.clock = clock
        self.since = clock()

    def lines(self, snap: Snapshot | None) -> list[str]:
        waited = self.clock() - self.since
        if waited < NO_HELLO_S:
            return []
        seen = {r.rank for r in snap.ranks} if snap is not None else set()
        world = snap.world_size if snap is not None else 0
        rejected = snap.rejected_total if snap is not None else 0
        if seen and len(seen) >= world:
            return []
        if seen:
            absent = [r for r in range(world) if r not in seen]
            shown = ", ".join(map(str, absent[:8])) + (" ..." if len(absent) > 8 else "")
            head = f"ranks {shown} of {world} have not said hello in {waited:.0f} s"
        else:
            head = f"no rank has said hello in {waited:.0f} s"
        if rejected and snap is not None:
            why = ", ".join(f"{k} {v}" for k, v in sorted(snap.rejected.items()))
            head += f" · {rejected} frames refused ({why}): workers with another run's key?"
        if self.watch:
            check = (
                "check: the job has this run's connection file (COMMTOP_CONNECTION_FILE, the key in it), reaches "
                "its endpoint, and starts the script with `-m workers.capture.bootstrap` or uses workers.monitor (i)"
            )
        else:
            check = (
                "check the job's output (l): still starting, failed before its first collective, "
                "COMMTOP_CAPTURE=off, or a `torchrun ...` command run as given (not through the capture bootstrap)"
            )
        return [head, check]
