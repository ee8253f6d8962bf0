"""How the event ring talks to CUDA: torch's ``Event`` methods, or the CUDA runtime directly.

Each torch ``Event.record(stream)`` / ``query()`` / ``elapsed_time()`` goes through torch's
Python binding (argument parsing, a device guard, a Stream object unpacked): a few µs of the
loop thread's CPU per call, most of the 14.5 µs per record measured on the H200. The runtime's
own ``cudaEventRecord`` called through ``ctypes`` on the raw handles of the *same* torch
events does the same GPU work for a fraction of that. ``PyDLL`` keeps the GIL across the call
(no release and re-acquire per record); these calls do not wait for the GPU.

Both flavours offer the same four calls on opaque handles, so :class:`~workers.rank.timing.CudaTimer`
has one code path; tests use :class:`TorchEvents` with fake events.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600


class TorchEvents:
    """Handles are the torch ``Event`` objects themselves; ``stream`` None = current stream."""

    name = "torch"

    def prepare(self, events: list[Any], stream: Any) -> None:
        pass

    def handle(self, event: Any) -> Any:
        return event

    def stream_handle(self, stream: Any) -> Any:
        return stream

    def recorder(self) -> Callable[[Any, Any], Any]:
        return _torch_record

    def query(self) -> Callable[[Any], bool]:
        return _torch_query

    def elapsed_ms(self) -> Callable[[Any, Any], float]:
        """A per-caller function (the runtime flavour keeps an output buffer in it)."""
        return _torch_elapsed


def _torch_record(event: Any, stream: Any) -> None:
    event.record(stream)


def _torch_query(event: Any) -> bool:
    return bool(event.query())


def _torch_elapsed(a: Any, b: Any) -> float:
    return float(a.elapsed_time(b))


class RuntimeEvents:
    """The CUDA runtime library torch itself loaded, called on raw ``cudaEvent_t`` / ``cudaStream_t``.

    torch creates an event's CUDA handle at its first record, so :meth:`handle` needs events
    recorded once (the timer does that at start-up, with the one sync it is allowed)."""

    name = "cudart"

    def __init__(self, path: str) -> None:
        lib = ctypes.PyDLL(path)
        self._record = lib.cudaEventRecord
        self._record.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        self._record.restype = ctypes.c_int
        self._query = lib.cudaEventQuery
        self._query.argtypes = (ctypes.c_void_p,)
        self._query.restype = ctypes.c_int
        self._elapsed = lib.cudaEventElapsedTime
        self._elapsed.argtypes = (ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p)
        self._elapsed.restype = ctypes.c_int
        self.path = path

    def prepare(self, events: list[Any], stream: Any) -> None:
        """Record every event once (torch creates the CUDA event then) and wait for them:
        start-up only, before any timed work."""
        for e in events:
            e.record(stream)
        if events:
            events[-1].synchronize()

    def handle(self, event: Any) -> int:
        h = int(event.cuda_event)
        if not h:
            raise ValueError("a torch Event has no CUDA handle before its first record")
        return h

    def stream_handle(self, stream: Any) -> int:
        return int(stream.cuda_stream)

    def recorder(self) -> Callable[[Any, Any], Any]:
        return self._record  # returns the error code; a failing context fails the collective too

    def query(self) -> Callable[[Any], bool]:
        q = self._query

        def query(event: Any) -> bool:
            rc = q(event)
            if rc == CUDA_SUCCESS:
                return True
            if rc == CUDA_ERROR_NOT_READY:
                return False
            raise RuntimeError(f"cudaEventQuery failed: CUDA error {rc}")

        return query

    def elapsed_ms(self) -> Callable[[Any, Any], float]:
        out = ctypes.c_float()
        ref = ctypes.byref(out)
        el = self._elapsed

        def elapsed_ms(a: Any, b: Any) -> float:
            rc = el(ref, a, b)
            if rc:
                raise RuntimeError(f"cudaEventElapsedTime failed: CUDA error {rc}")
            return out.value

        return elapsed_ms


def loaded_cudart(torch: Any, maps: str = "/proc/self/maps") -> str:
    """Path of the libcudart torch loaded into this process (its major version), or ''."""
    major = str(getattr(torch.version, "cuda", "") or "").split(".")[0]
    try:
        with open(maps) as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return ""
    for p in sorted(paths):
        if major and f"libcudart.so.{major}" in p:
            return p
    return sorted(paths)[0] if len(paths) == 1 else ""


def runtime_events(torch: Any) -> RuntimeEvents | TorchEvents:
    """The direct runtime when torch's libcudart can be found and called; torch's methods
    otherwise (statically linked runtime, no /proc): slower, the same numbers."""
    path = loaded_cudart(torch)
    if not path:
        return TorchEvents()
    try:
        return RuntimeEvents(path)
    except (OSError, AttributeError):
        return TorchEvents()
