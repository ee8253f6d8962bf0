"""How a rank's job ends, as its Bye says it: the status Python gives a ``SystemExit``."""

from __future__ import annotations

from workers.wire.endings import bye_reason


def system_exit_status(exc: SystemExit) -> tuple[int, str]:
    """(exit status, Bye reason) of a process that an uncaught ``SystemExit`` ends, as Python
    sets the status: None or 0 -> 0, another int -> it, anything else (Python prints it to
    stderr) -> 1. ``sys.exit(3)`` said "finished" before: SystemExit never reaches excepthook."""
    code = exc.code
    if code is None or (isinstance(code, int) and code == 0):
        return 0, "finished"
    if isinstance(code, int):
        return code, f"sys.exit({code})"
    return 1, bye_reason(exc)
