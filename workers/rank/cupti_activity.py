"""CUPTI activity records read in bulk: memcpy and kernel records as numpy columns, no Python
object per record (torch-free; the decoder is also CUPTI-free, for tests on captured buffers).

``cupti-python`` builds one Python object per record on CUPTI's thread, holding the GIL:
13.6 us per record on the H200 (benchmarks/CAPTURE.md), a fifth of a core at the synthetic
loop's 15,000 collectives/s. Here ``libcupti`` is called through ``ctypes``: CUPTI hands over
a filled buffer, :func:`decode_buffer` walks it once (a few hundred ns per record to find
where each record starts, the rest are numpy gathers) and keeps only the fields commtop uses.

Record layouts are CUPTI's ``CUpti_ActivityMemcpy6`` and ``CUpti_ActivityKernel10`` (CUDA
13); only leading fields are read, which have kept their offsets since CUPTI 10. A record's
size is asked from CUPTI itself (``cuptiActivityGetNextRecord``) the first time its kind is
seen, so a kind whose struct grew is still walked correctly.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: CUpti_ActivityKind values.
KIND_MEMCPY = 1
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
#: CUpti_ActivityMemcpyKind values.
MEMCPY_HTOD = 1
MEMCPY_DTOH = 2
MEMCPY_DTOD = 8
#: CUpti_ActivityMemoryKind: pinned host memory.
MEMORY_PINNED = 2
CUPTI_SUCCESS = 0
FLUSH_FORCED = 1

#: Byte offsets of the fields read: (offset, numpy type).
MEMCPY_FIELDS: dict[str, tuple[int, str]] = {
    "copy_kind": (4, "u1"),
    "src_kind": (5, "u1"),
    "dst_kind": (6, "u1"),
    "bytes": (8, "u8"),
    "start": (16, "u8"),
    "end": (24, "u8"),
    "device_id": (32, "u4"),
    "stream_id": (40, "u4"),
    "correlation_id": (44, "u4"),
}
KERNEL_FIELDS: dict[str, tuple[int, str]] = {
    "start": (16, "u8"),
    "end": (24, "u8"),
    "device_id": (40, "u4"),
    "stream_id": (48, "u4"),
    "correlation_id": (92, "u4"),
    "name": (104, "u8"),  # const char *
}
#: Small enough that a buffer fills (and is handed over) within ~50 ms at 15,000 records/s.
BUFFER_BYTES = 256 << 10
#: Buffers decoded but not yet taken by a reader; beyond this the oldest is dropped (counted).
MAX_PENDING = 256


class CuptiUnavailable(RuntimeError):
    """CUPTI cannot be used in this process (no library, or another client holds it)."""


@dataclass
class Decoded:
    """One buffer's records: ``memcpy`` and ``kernel`` map field name -> array (record order)."""

    memcpy: dict[str, np.ndarray]
    kernel: dict[str, np.ndarray]
    other: int = 0  # records of kinds not decoded here


def _gather(
    words: dict[str, np.ndarray], offsets: np.ndarray, fields: dict[str, tuple[int, str]]
) -> dict[str, np.ndarray]:
    out = {}
    for name, (off, kind) in fields.items():
        width = int(kind[1])
        view = words[kind]
        out[name] = view[(offsets + off) // width].copy()
    return out


def walk(kinds_at: Callable[[int], int], valid: int, size_of: Callable[[int, int], int]) -> tuple[list[int], list[int]]:
    """Offsets and kinds of the records in a buffer of ``valid`` bytes. ``kinds_at(off)``
    reads a record's kind; ``size_of(kind, off)`` gives a record's size (learnt once a kind)."""
    offsets: list[int] = []
    kinds: list[int] = []
    off = 0
    while off < valid:
        k = kinds_at(off)
        offsets.append(off)
        kinds.append(k)
        n = size_of(k, off)
        if n <= 0:
            break
        off += n
    return offsets, kinds


def _uniform(u32: np.ndarray, valid: int, size: Callable[[int, int], int]) -> tuple[Any, Any]:
    """Offsets and kinds when every record of the buffer has the first one's kind (a buffer
    of memcpy records only, or kernels only): one numpy check instead of a walk."""
    if not valid:
        return np.empty(0, np.int64), np.empty(0, np.uint32)
    k0 = int(u32[0])
    stride = size(k0, 0)
    if stride <= 0 or stride % 4 or valid % stride:
        return None, None
    offsets = np.arange(0, valid, stride, dtype=np.int64)
    kinds = u32[offsets >> 2]
    if not (kinds == k0).all():
        return None, None
    return offsets, kinds


def decode_buffer(
    data: bytes | memoryview | np.ndarray, sizes: dict[int, int], size_of: Callable[[int, int], int] | None = None
) -> Decoded:
    """Decode one filled CUPTI buffer. ``sizes``: record size per kind (grown through
    ``size_of(kind, offset)`` for kinds not in it; without ``size_of`` an unknown kind ends
    the walk, as a truncated buffer would)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    valid = len(raw) - len(raw) % 8
    raw = raw[:valid]
    words: dict[str, np.ndarray] = {"u1": raw, "u4": raw.view(np.uint32), "u8": raw.view(np.uint64)}
    u32 = words["u4"]

    def size(kind: int, off: int) -> int:
        n = sizes.get(kind)
        if n is None:
            if size_of is None:
                return 0
            n = sizes[kind] = size_of(kind, off)
        return n

    off_arr, kind_arr = _uniform(u32, valid, size)
    if off_arr is None:
        offsets, kinds = walk(lambda off: int(u32[off >> 2]), valid, size)
        off_arr = np.asarray(offsets, dtype=np.int64)
        kind_arr = np.asarray(kinds, dtype=np.uint32)
    # A record cut by the end of the buffer (only in a corrupt or truncated copy) is left out.
    rec_size = np.full(len(off_arr), valid, dtype=np.int64)
    for k in np.unique(kind_arr).tolist():
        rec_size[kind_arr == k] = sizes.get(int(k), valid + 1)  # unknown size: not whole
    ends = off_arr + rec_size
    whole = ends <= valid
    mem = off_arr[(kind_arr == KIND_MEMCPY) & whole]
    ker = off_arr[((kind_arr == KIND_CONCURRENT_KERNEL) | (kind_arr == KIND_KERNEL)) & whole]
    other = int(len(off_arr) - len(mem) - len(ker))
    return Decoded(_gather(words, mem, MEMCPY_FIELDS), _gather(words, ker, KERNEL_FIELDS), other)


def find_library() -> str:
    """libcupti: the one CUDA's Python wheels bring (torch's cu12x/cu13x), else the system's."""
    env = os.environ.get("COMMTOP_CUPTI_LIB", "")
    if env:
        return env
    roots = [p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]
    found: list[str] = []
    for root in roots:
        found += glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcupti.so*"))
        found += glob.glob(os.path.join(root, "nvidia", "*", "*", "lib", "libcupti.so*"))
    for path in sorted(found, reverse=True):  # the newest major first (cu13 > cuda_cupti 12)
        return path
    for path in ("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so", "libcupti.so"):
        try:
            ctypes.CDLL(path)
            return path
        except OSError:
            continue
    return ""


_REQUESTED = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_COMPLETED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class CuptiActivity:
    """The process's CUPTI activity client (one per process: see :func:`client`).

    CUPTI calls ``_requested`` for an empty buffer and ``_completed`` with a filled one, on
    its own thread; ``_completed`` decodes it (numpy, the GIL held ~0.3 us per record) and
    queues the :class:`Decoded`. Readers call :meth:`take`. Buffers are reused from a pool."""

    def __init__(self, path: str = "") -> None:
        path = path or find_library()
        if not path:
            raise CuptiUnavailable("no libcupti found (install torch's CUDA wheels or set COMMTOP_CUPTI_LIB)")
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise CuptiUnavailable(f"cannot load {path}: {exc}") from exc
        self.path = path
        self.lib = lib
        for name, args in {
            "cuptiActivityRegisterCallbacks": (_REQUESTED, _COMPLETED),
            "cuptiActivityEnable": (ctypes.c_int,),
            "cuptiActivityDisable": (ctypes.c_int,),
            "cuptiActivityFlushAll": (ctypes.c_uint32,),
            "cuptiActivityFlushPeriod": (ctypes.c_uint32,),
            "cuptiGetTimestamp": (ctypes.POINTER(ctypes.c_uint64),),
            "cuptiActivityGetNextRecord": (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)),
            "cuptiGetResultString": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
            "cuptiActivityGetNumDroppedRecords": (ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_size_t)),
        }.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        self.sizes: dict[int, int] = {}
        self._free: list[Any] = []
        self._held: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.ready: deque[Decoded] = deque()
        self.records = 0
        self.callback_cpu_ns = 0  # CPU time of _completed (CUPTI's thread), for benchmarks
        self.lost_buffers = 0
        self.errors = 0
        self.last_error = ""
        self._names: dict[int, str] = {}
        self._enabled: list[int] = []
        self.raw_sink: list[bytes] | None = None
        self._paused = False
        # Keep the callbacks alive as long as CUPTI may call them.
        self._cb_requested = _REQUESTED(self._requested)
        self._cb_completed = _COMPLETED(self._completed)
        self._ts = ctypes.c_uint64()

    def _check(self, rc: int, what: str) -> None:
        if rc != CUPTI_SUCCESS:
            msg = ctypes.c_char_p()
            self.lib.cuptiGetResultString(rc, ctypes.byref(msg))
            text = (msg.value or b"").decode(errors="replace")
            raise CuptiUnavailable(f"{what} failed: CUPTI error {rc} {text}".strip())

    def start(self, kinds: tuple[int, ...] = (KIND_MEMCPY, KIND_CONCURRENT_KERNEL), flush_ms: int = 50) -> None:
        """Register the buffer callbacks and enable ``kinds``; fails if another CUPTI client
        (torch.profiler, Nsight Systems) holds activity tracing."""
        self._check(
            self.lib.cuptiActivityRegisterCallbacks(self._cb_requested, self._cb_completed),
            "cuptiActivityRegisterCallbacks",
        )
        for k in kinds:
            self._check(self.lib.cuptiActivityEnable(k), f"cuptiActivityEnable({k})")
            self._enabled.append(k)
        if flush_ms:
            self._check(self.lib.cuptiActivityFlushPeriod(flush_ms), "cuptiActivityFlushPeriod")

    def stop(self) -> None:
        """Flush what is left and disable the kinds (at exit; best effort)."""
        self.flush(forced=True)
        for k in self._enabled:
            self.lib.cuptiActivityDisable(k)
        self._enabled.clear()

    def pause(self) -> None:
        """Stop recording (the bare twin of an A/B); buffers already filled are kept."""
        if not self._paused:
            for k in self._enabled:
                self.lib.cuptiActivityDisable(k)
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            for k in self._enabled:
                self._check(self.lib.cuptiActivityEnable(k), f"cuptiActivityEnable({k})")
            self._paused = False

    def flush(self, forced: bool = False) -> None:
        """Hand every completed buffer over now (``forced``: also unfinished records; may wait
        for CUPTI's thread, so only at set-up and exit)."""
        self.lib.cuptiActivityFlushAll(FLUSH_FORCED if forced else 0)

    def timestamp(self) -> int:
        """CUPTI's clock now (ns; the clock of every record's start and end)."""
        self.lib.cuptiGetTimestamp(ctypes.byref(self._ts))
        return int(self._ts.value)

    def dropped(self) -> int:
        out = ctypes.c_size_t()
        rc = self.lib.cuptiActivityGetNumDroppedRecords(None, 0, ctypes.byref(out))
        return int(out.value) if rc == CUPTI_SUCCESS else 0

    def kernel_name(self, ptr: int) -> str:
        """A kernel record's name (a pointer CUPTI owns; read once per distinct pointer)."""
        name = self._names.get(ptr)
        if name is None:
            name = self._names[ptr] = (ctypes.string_at(ptr) if ptr else b"").decode(errors="replace")
        return name

    def take(self) -> list[Decoded]:
        out = []
        ready = self.ready
        while ready:
            out.append(ready.popleft())
        return out

    # CUPTI's thread ------------------------------------------------------------------

    def _requested(self, buf: Any, size: Any, max_records: Any) -> None:
        with self._lock:
            b = self._free.pop() if self._free else (ctypes.c_uint8 * BUFFER_BYTES)()
            addr = ctypes.addressof(b)
            self._held[addr] = b
        buf[0] = addr
        size[0] = BUFFER_BYTES
        max_records[0] = 0

    def _completed(self, ctx: Any, stream_id: int, buf: int, size: int, valid: int) -> None:
        t0 = time.thread_time_ns()
        try:
            with self._lock:
                b = self._held.pop(buf, None)
            if b is None:
                return
            try:
                if valid:
                    view = memoryview(b).cast("B")[:valid]
                    if self.raw_sink is not None:  # fixtures and probes: the buffer as CUPTI filled it
                        self.raw_sink.append(bytes(view))
                    d = decode_buffer(view, self.sizes, lambda k, off: self._record_size(buf, valid, off))
                    self.records += len(d.memcpy["start"]) + len(d.kernel["start"]) + d.other
                    if len(self.ready) >= MAX_PENDING:
                        self.ready.popleft()
                        self.lost_buffers += 1
                    self.ready.append(d)
            finally:
                with self._lock:
                    self._free.append(b)
        except Exception as exc:  # noqa: BLE001 - never raise into CUPTI's thread
            self.errors += 1
            self.last_error = repr(exc)
        self.callback_cpu_ns += time.thread_time_ns() - t0

    def _record_size(self, buf: int, valid: int, off: int) -> int:
        rec = ctypes.c_void_p(buf + off)
        rc = self.lib.cuptiActivityGetNextRecord(ctypes.c_void_p(buf), valid, ctypes.byref(rec))
        if rc != CUPTI_SUCCESS or not rec.value:
            return valid - off  # the last record of the buffer
        return int(rec.value) - (buf + off)


_client: CuptiActivity | None = None
_client_error = ""


def client(kinds: tuple[int, ...] = (KIND_MEMCPY, KIND_CONCURRENT_KERNEL)) -> CuptiActivity:
    """The process's one CUPTI client, started on first use with ``kinds`` (later callers
    get it as it is); raises :class:`CuptiUnavailable` (the same message every time) where
    it cannot run."""
    global _client, _client_error
    if _client is not None:
        return _client
    if _client_error:
        raise CuptiUnavailable(_client_error)
    if os.environ.get("COMMTOP_CUPTI", "1") == "0":
        _client_error = "CUPTI turned off (COMMTOP_CUPTI=0)"
        raise CuptiUnavailable(_client_error)
    try:
        c = CuptiActivity()
        c.start(kinds)
    except CuptiUnavailable as exc:
        _client_error = str(exc)
        raise
    _client = c
    return c
