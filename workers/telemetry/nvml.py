"""The NVML layer: one query helper, typed "n/a", lazy locked init. Knows nothing of UI or zmq.

Why a helper: NVML answers "not supported" per device and per call, and a profiler must show
that as "n/a (reason)", never as 0 (DCGM issues #149/#236 show what zeros do to readers).
Every call goes through :func:`query`, which returns the value or an :class:`NA`, and logs
each unsupported (function, reason) once, so a 10 Hz loop does not flood the log.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("commtop.telemetry.nvml")

NVML_MISSING = "NVML not available"
NOT_SUPPORTED = "not supported by this GPU/driver"
NO_PERMISSION = "no permission"
NO_NVLINK = "no NVLink"
GPU_LOST = "GPU is lost"

T = TypeVar("T")


@dataclass(frozen=True)
class NA:
    """A metric that has no value, and why (shown to the user as ``n/a: <reason>``)."""

    reason: str
    detail: str = ""

    def __bool__(self) -> bool:  # so `if value:` never mistakes n/a for a reading
        return False

    def __str__(self) -> str:
        return f"n/a: {self.reason}"


_lock = threading.Lock()
_state: NA | bool | None = None  # None: not tried; True: initialised; NA: failed (sticky)
_logged: set[tuple[str, str]] = set()
pynvml: Any = None  # the module, once imported


def reason_for(exc: BaseException) -> NA:
    """Map an NVML exception to the reason users see."""
    mod = pynvml
    code = getattr(exc, "value", None)
    if mod is None or code is None:
        return NA(NVML_MISSING, str(exc)[:200])
    if code == mod.NVML_ERROR_NOT_SUPPORTED:
        return NA(NOT_SUPPORTED)
    if code == mod.NVML_ERROR_NO_PERMISSION:
        return NA(NO_PERMISSION)
    if code in (
        mod.NVML_ERROR_LIBRARY_NOT_FOUND,
        mod.NVML_ERROR_UNINITIALIZED,
        mod.NVML_ERROR_DRIVER_NOT_LOADED,
    ):
        return NA(NVML_MISSING, str(exc))
    if code == mod.NVML_ERROR_FUNCTION_NOT_FOUND:
        return NA(NOT_SUPPORTED, "function not in this driver's NVML")
    if code == mod.NVML_ERROR_GPU_IS_LOST:
        return NA(GPU_LOST)
    return NA(f"NVML error: {exc}"[:200])


def init() -> NA | None:
    """Initialise NVML once (thread-safe); None on success, else the sticky reason."""
    global _state, pynvml
    with _lock:
        if _state is True:
            return None
        if isinstance(_state, NA):
            return _state
        try:
            import pynvml as mod  # nvidia-ml-py
        except ImportError:
            _state = NA(NVML_MISSING, "the nvidia-ml-py (pynvml) package is not installed")
            return _state
        pynvml = mod
        try:
            mod.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError...
            reason = reason_for(exc)
            _state = NA(NVML_MISSING, reason.detail or str(exc)) if reason.reason != NO_PERMISSION else reason
            log.info("NVML unavailable: %s", _state.detail or _state.reason)
            return _state
        _state = True
        atexit.register(shutdown)
        return None


def shutdown() -> None:
    """Release NVML (registered at exit); a later call to :func:`init` starts again."""
    global _state
    with _lock:
        if _state is True and pynvml is not None:
            try:
                pynvml.nvmlShutdown()
            except Exception:  # already shut down, library gone: nothing to do at exit
                pass
        _state = None


def available() -> NA | None:
    """None if NVML works, else why not (initialises on first use)."""
    return init()


def query(fn: Callable[..., T], *args: Any) -> T | NA:
    """Call one NVML function; its value, or an NA with the reason. Never raises NVMLError."""
    failed = init()
    if failed is not None:
        return failed
    return call(fn, *args)


def call(fn: Callable[..., T], *args: Any) -> T | NA:
    """Call an NVML function (NVML already initialised): its value or an NA; logs once."""
    try:
        return fn(*args)
    except Exception as exc:
        if pynvml is not None and not isinstance(exc, pynvml.NVMLError):
            # a pynvml/ctypes bug, not a device answer: still n/a, but say what it was
            na = NA(f"error: {type(exc).__name__}", str(exc)[:200])
        else:
            na = reason_for(exc)
        _log_once(getattr(fn, "__name__", str(fn)), na)
        return na


def _log_once(name: str, na: NA) -> None:
    key = (name, na.reason)
    if key not in _logged and len(_logged) < 1024:
        _logged.add(key)
        log.info("%s: %s", name, na)


def ret_na(code: int) -> NA | None:
    """Reason for a per-entry nvmlReturn (field values, GPM metrics); None when it is success."""
    if code == 0:
        return None
    if pynvml is None:
        return NA(NVML_MISSING)
    try:
        err = pynvml.NVMLError(code)
    except Exception:  # unknown code
        return NA(f"NVML error {code}")
    return reason_for(err)


def _reset_for_tests() -> None:
    """Forget init state (tests re-run the real 'NVML missing' path)."""
    global _state
    with _lock:
        _state = None
        _logged.clear()
