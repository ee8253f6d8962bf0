"""A rank that ends with ``os._exit``: what it timed goes out with its Bye first.

``os._exit`` skips ``atexit`` and Python's finalisation, and some jobs end that way on purpose
(frameworks call it to skip a slow or hanging teardown, a watchdog to stop a stuck rank). Under
commtop such a rank's last batches were never sent and it never said Bye: the recording held
fewer collectives than the job issued, with nothing counted as missing, and the rank stayed
"live". Here ``os._exit`` is wrapped in the rank's process (the pid that installed it: a forked
helper calls torch's and multiprocessing's ``os._exit`` untouched) so that the capture's last
read and the monitor's close run first, bounded as on SIGTERM, then the original ends the
process with the job's exit code. coverage.py patches ``os._exit`` for the same reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn

_original: Callable[[int], NoReturn] | None = None
_owner_pid = 0
_flush: Callable[[int], None] | None = None


def install(flush: Callable[[int], None]) -> None:
    """``flush(code)`` runs once, in this process, when it calls ``os._exit(code)``."""
    global _original, _owner_pid, _flush
    if _original is None:
        _original = os._exit
        _exit.__commtop_original__ = _original  # type: ignore[attr-defined]  # for an exit that must not wait
        os._exit = _exit  # type: ignore[assignment]
    _owner_pid = os.getpid()
    _flush = flush


def uninstall() -> None:
    """Put ``os._exit`` back (tests)."""
    global _original, _flush
    if _original is not None:
        os._exit = _original  # type: ignore[assignment]
    _original = _flush = None


def _exit(status: int) -> NoReturn:
    global _flush
    flush, original = _flush, _original
    assert original is not None
    if flush is not None and os.getpid() == _owner_pid:
        _flush = None  # once: a flush that calls os._exit itself ends here
        try:
            flush(int(status))
        except BaseException:  # noqa: BLE001, S110 - the job's exit comes first, whatever happened
            pass
    original(status)
