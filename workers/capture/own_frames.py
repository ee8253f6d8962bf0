"""The job's uncaught tracebacks as the script run alone prints them: without the frames commtop
adds, the bootstrap and runpy that start the script (nine frames above its own first line) and
the hooks' wrapper between a collective's call and torch's code.

Only what is printed changes (``sys.excepthook``): the exception, its message and the script's
and torch's frames are the job's own, and so is the exit code. The last frame is always kept.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

_CAPTURE = Path(__file__).resolve().parent
#: Files whose frames come before the script's first (its start).
STARTUP = frozenset({str(_CAPTURE / "bootstrap.py")})
#: Files of wrappers that sit between the job's call and torch's code (collectives, waits,
#: init/destroy_process_group, new_group, CUDA graph replays, spawned ranks).
WRAPPERS = frozenset(
    str(path)
    for path in (
        _CAPTURE.parent / "monitor" / "patch.py",
        _CAPTURE.parent / "monitor" / "wait_hook.py",
        _CAPTURE.parent / "monitor" / "graphs.py",
        _CAPTURE / "capture.py",
        _CAPTURE / "fallback.py",
        _CAPTURE / "caller_warnings.py",
        _CAPTURE / "gloo_side.py",
        _CAPTURE / "spawned.py",
    )
)


def _is_runpy(filename: str) -> bool:
    return filename == "<frozen runpy>" or filename.endswith(("/runpy.py", "\\runpy.py"))


def without_own_frames(
    tb: TracebackType | None, startup: Collection[str] = STARTUP, wrappers: Collection[str] = WRAPPERS
) -> TracebackType | None:
    """``tb`` without the leading frames of ``startup`` files and runpy, and without the frames
    of ``wrappers`` (relinked in place: ``tb_next`` is writable)."""
    frames: list[TracebackType] = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if not frames:
        return None
    first = 0
    while first < len(frames) - 1:
        filename = frames[first].tb_frame.f_code.co_filename
        if filename not in startup and not _is_runpy(filename):
            break
        first += 1
    kept = [t for t in frames[first:-1] if t.tb_frame.f_code.co_filename not in wrappers] + [frames[-1]]
    for a, b in zip(kept, kept[1:], strict=False):
        a.tb_next = b
    kept[-1].tb_next = None
    return kept[0]


def install() -> None:
    """Print the job's uncaught exceptions (and the ones chained to them) without commtop's frames."""
    previous = sys.excepthook

    def excepthook(et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> None:
        try:
            tb = without_own_frames(tb)
            seen = {id(ev)}
            chained = ev.__cause__ or ev.__context__
            while chained is not None and id(chained) not in seen:
                seen.add(id(chained))
                chained.__traceback__ = without_own_frames(chained.__traceback__)
                chained = chained.__cause__ or chained.__context__
            ev.__traceback__ = tb
        except Exception:  # noqa: BLE001 - the traceback as it was, rather than none
            pass
        previous(et, ev, tb)

    sys.excepthook = excepthook
