"""The ``.commtop`` file layout, and the codec of its chunks (columns in, bytes out, and back).

Layout (integers little-endian)::

    prefix  b"\\x89CMTREC\\n" + u16 format version + u16 reserved                 (12 bytes)
    frame   b"\\xd7CMF" | u8 type | u8 flags | u32 length | u32 crc32 | payload   (14 + length)

The crc32 covers type, flags, length and payload, so a flipped byte anywhere in a frame is
caught; a reader that meets a bad frame reports its offset, searches for the next marker and
reads on. A file cut at any byte keeps every frame before the cut. Frame types:

* HEADER: msgpack map of run metadata (tool and schema version, clock source, ranks, hosts,
  GPUs, config: whatever the recorder knew at start; the Hello messages are in the stream too).
* CHUNK: the messages received in about one flush interval. A 28-byte uncompressed prefix
  (first/last receive time, message and record counts) lets a reader index a file without
  decompressing it; the body is msgpack, compressed (zstd; zlib in older files: flags say which,
  :mod:`tui.recordings.compression`) when that is smaller. Batches are
  stored columnar: every column of all batches in the chunk is concatenated, delta-encoded
  where values creep (iteration, step, start_ns, the bits of dur_us), narrowed to the fewest
  bytes that hold it and byte-shuffled, so zlib sees long runs of equal bytes. algbw/busbw/gbps
  are stored as the XOR of their bits with the value recomputed from nbytes and dur_us: zero
  (free) when the worker used the usual formula, and still exact when it did not. The
  collective part also holds a summary per (epoch, rank) (:mod:`tui.recordings.summary`):
  counts, sums and first/last times, so ``commtop report`` decodes durations, not every column.
* TRAILER: totals, written on a clean close only; without it the recording is "incomplete".

Frames are written by :mod:`tui.recordings.writer` and read by :mod:`tui.recordings.reader`;
this module is what both agree on, plus the decoded shapes: one chunk (:class:`DecodedChunk`),
a chunk's place in a file (:class:`ChunkInfo`) and a whole recording's columns (:class:`Tables`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from tui.recordings import summary
from workers.wire import protocol as p
from workers.wire.busbw import algbw_gbps
from workers.wire.telemetry import Tick

MAGIC = b"\x89CMTREC\n"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sHH")
MARKER = b"\xd7CMF"
FRAME = struct.Struct("<4sBBII")  # marker, type, flags, length, crc32
CHUNK_PREFIX = struct.Struct("<qqIII")  # first recv_ns, last recv_ns, messages, coll records, copy records
HEADER, CHUNK, TRAILER = 1, 2, 3
MAX_FRAME = 256 * 1024 * 1024

# Kind codes of the messages in a chunk, in arrival order.
K_COLL, K_COPY, K_HELLO, K_BYE, K_DICT = 0, 1, 2, 3, 4

#: Columns added after recordings were first made: a chunk without one reads as zeros.
OPTIONAL_COLUMNS = frozenset({"group", "dtype"})

# How each column is stored: d = delta int, p = plain int, f = delta of float32 bits,
# h = host_ns - start_ns, a = algbw residual, b = busbw residual, g = gbps residual.
COLL_CODECS = {
    "iteration": "d",
    "step": "d",
    "epoch": "d",
    "mode": "p",
    "op": "p",
    "group": "p",
    "dtype": "p",
    "nbytes": "d",
    "start_ns": "d",
    "host_ns": "h",
    "dur_us": "f",
    "algbw": "a",
    "busbw": "b",
}
COPY_CODECS = {
    "step": "d",
    "epoch": "d",
    "nbytes": "d",
    "direction": "p",
    "pinned": "p",
    "start_ns": "d",
    "dur_us": "f",
    "gbps": "g",
}
# Batch header fields, stored as per-batch int columns.
BATCH_FIELDS = ("rank", "seq", "dropped", "epoch_in_force", "pending_epoch", "apply_at", "t_ns")


class _BadChunk(Exception):
    """A chunk passed its checksum but does not decode (a bug or a newer format)."""


# --------------------------------------------------------------------------- column codecs

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _shuffle(values: np.ndarray) -> bytes:
    """Bytes grouped by significance (all low bytes, then the next...): zlib loves it."""
    width = values.dtype.itemsize
    if width == 1:
        return values.tobytes()
    return values.view(np.uint8).reshape(-1, width).T.tobytes()


def _unshuffle(payload: bytes, width: int, count: int) -> np.ndarray:
    if len(payload) != width * count:
        raise _BadChunk(f"column holds {len(payload)} bytes, expected {count} x {width}")
    raw = np.frombuffer(payload, dtype=np.uint8)
    if width == 1:
        return raw
    return np.ascontiguousarray(raw.reshape(width, count).T).view(_UINT[width]).reshape(count)


def _enc_int(values: np.ndarray, delta: bool) -> list[Any]:
    """[delta, first, base, width, bytes, n]: frame-of-reference over the value or its delta,
    in the narrowest unsigned width (0 = all equal). Wrapping int64 arithmetic is exact."""
    a = np.asarray(values).astype(np.int64, copy=False)
    n = len(a)
    if n == 0:
        return [int(delta), 0, 0, 0, b"", 0]
    first = int(a[0])
    v = np.diff(a) if delta else a
    if len(v) == 0:
        return [int(delta), first, 0, 0, b"", n]
    base = int(v.min())
    u = (v - np.int64(base)).view(np.uint64)  # wraps (silently, for arrays) where the range is huge
    top = int(u.max())
    width = 0 if top == 0 else 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
    payload = b"" if width == 0 else _shuffle(u.astype(_UINT[width]))
    return [int(delta), first, base, width, payload, n]


def zeros_enc(n: int) -> tuple[bool, int, int, int, bytes, int]:
    """The encoding of ``n`` zeros: what an optional column absent from an older chunk holds."""
    return (False, 0, 0, 0, b"", n)


def _dec_int(enc: Any) -> np.ndarray:
    try:
        delta, first, base, width, payload, n = enc
    except (TypeError, ValueError):
        raise _BadChunk("bad column") from None
    if width not in (0, 1, 2, 4, 8) or not isinstance(n, int) or n < 0:
        raise _BadChunk("bad column header")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    m = n - 1 if delta else n
    # numpy integer arrays wrap silently on overflow, which is exactly what the encoder relied on.
    if width == 0:
        if delta:
            return np.arange(n, dtype=np.int64) * np.int64(base) + np.int64(first)
        return np.full(m, base, dtype=np.int64)
    u = _unshuffle(payload, width, m)
    v = u.view(np.int64) if width == 8 else u.astype(np.int64)
    if base:
        v += np.int64(base)
    if not delta:
        return v
    out = np.empty(n, dtype=np.int64)
    out[0] = first
    np.cumsum(v, out=out[1:])
    out[1:] += np.int64(first)
    return out


def _f32_bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def _recomputed(codec: str, cols: dict[str, np.ndarray], factor: np.ndarray | None) -> np.ndarray:
    """The float32 value an algbw/busbw/gbps column most likely holds."""
    if codec in ("a", "g"):
        return algbw_gbps(cols["nbytes"], cols["dur_us"]).astype(np.float32)
    assert factor is not None
    return (cols["algbw"].astype(np.float64) * factor).astype(np.float32)


def _busbw_factor(algbw: np.ndarray, busbw: np.ndarray) -> float:
    ok = np.flatnonzero(np.isfinite(algbw) & (algbw > 0))
    return float(busbw[ok[0]]) / float(algbw[ok[0]]) if len(ok) else 0.0


def _encode_part(batches: list[p.Batch], codecs: dict[str, str], schema: dict[str, str]) -> dict[str, Any]:
    """Every batch of one kind in a chunk: per-batch headers plus concatenated columns."""
    counts = np.array([len(b) for b in batches], dtype=np.int64)
    meta = {
        name: _enc_int(np.array([getattr(b, name) for b in batches], dtype=np.int64), False) for name in BATCH_FIELDS
    }
    meta["n"] = _enc_int(counts, False)
    cols = {name: np.concatenate([np.asarray(b.columns[name], dtype=schema[name]) for b in batches]) for name in schema}
    part: dict[str, Any] = {"m": meta}
    factor = None
    if "busbw" in codecs:
        factors = np.array([_busbw_factor(b.columns["algbw"], b.columns["busbw"]) for b in batches])
        part["bf"] = factors.tobytes()
        factor = np.repeat(factors, counts)
    enc: dict[str, Any] = {}
    for name, codec in codecs.items():
        col = cols[name]
        if codec == "d" or codec == "p":
            enc[name] = _enc_int(col, codec == "d")
        elif codec == "h":
            enc[name] = _enc_int(col - cols["start_ns"], False)
        elif codec == "f":
            enc[name] = _enc_int(_f32_bits(col).view(np.int32), True)
        else:
            enc[name] = _enc_int(_f32_bits(col) ^ _f32_bits(_recomputed(codec, cols, factor)), False)
    part["c"] = enc
    if codecs is COLL_CODECS:
        rank = np.repeat(np.array([b.rank for b in batches], dtype=np.int64), counts)
        if summary.summarizable(rank):
            part["s"] = summary.summarize(rank, cols)
    return part


def _decode_part(
    part: Any, codecs: dict[str, str], schema: dict[str, str], wanted: Sequence[str] | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(per-batch headers incl. "n", per-record columns); ``wanted`` limits the columns decoded."""
    if not isinstance(part, dict) or not isinstance(part.get("m"), dict) or not isinstance(part.get("c"), dict):
        raise _BadChunk("bad batch table")
    meta = {name: _dec_int(part["m"].get(name)) for name in (*BATCH_FIELDS, "n")}
    counts = meta["n"]
    total = int(counts.sum())
    need = set(schema if wanted is None else wanted)
    if need & {"algbw", "busbw", "gbps"}:
        need |= {"nbytes", "dur_us"}
    if "busbw" in need:
        need.add("algbw")
    if "host_ns" in need:
        need.add("start_ns")
    enc = part["c"]
    cols: dict[str, np.ndarray] = {}
    factor = None
    for name, codec in codecs.items():  # dict order puts every dependency first
        if name not in need:
            continue
        raw = _dec_int(enc[name] if name in enc or name not in OPTIONAL_COLUMNS else zeros_enc(total))
        if len(raw) != total:
            raise _BadChunk(f"column {name} has {len(raw)} values for {total} records")
        if codec in ("d", "p"):
            cols[name] = raw.astype(schema[name])
        elif codec == "h":
            cols[name] = raw + cols["start_ns"]
        elif codec == "f":
            cols[name] = raw.astype(np.int32).view(np.float32)
        else:
            if codec == "b":
                bf = part.get("bf")
                if not isinstance(bf, bytes) or len(bf) != 8 * len(counts):
                    raise _BadChunk("bad busbw factors")
                factor = np.repeat(np.frombuffer(bf, dtype=np.float64), counts)
            bits = raw.astype(np.uint32) ^ _f32_bits(_recomputed(codec, cols, factor))
            cols[name] = bits.view(np.float32)
    return meta, cols


def _nd_default(obj: Any) -> Any:
    """msgpack hook: numpy values inside TELEM dicts survive the round trip."""
    if isinstance(obj, np.ndarray):
        return {"__nd__": obj.dtype.str, "shape": list(obj.shape), "data": np.ascontiguousarray(obj).tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)  # something unexpected in a dict: keep a readable trace of it


def _nd_hook(obj: dict[str, Any]) -> Any:
    if "__nd__" in obj and len(obj) == 3:
        return np.frombuffer(obj["data"], dtype=np.dtype(obj["__nd__"])).reshape(obj["shape"]).copy()
    return obj


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=_nd_default)


def _unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, object_hook=_nd_hook)


def encode_chunk(items: Sequence[tuple[int, Any]]) -> tuple[bytes, int, int]:
    """(chunk body, collective records, copy records) for (recv_ns, message) pairs in arrival order."""
    kinds = np.empty(len(items), dtype=np.uint8)
    coll: list[p.Batch] = []
    copy: list[p.Batch] = []
    other: list[Any] = []
    for i, (_, msg) in enumerate(items):
        if isinstance(msg, p.Batch):
            if msg.kind == p.COLL:
                kinds[i] = K_COLL
                coll.append(msg)
            else:
                kinds[i] = K_COPY
                copy.append(msg)
        elif isinstance(msg, p.Hello):
            kinds[i] = K_HELLO
            other.append(p.hello_body("", msg))
        elif isinstance(msg, p.Bye):
            kinds[i] = K_BYE
            other.append(p.bye_body("", msg))
        else:
            kinds[i] = K_DICT
            other.append(msg)
    body: dict[str, Any] = {
        "t": _enc_int(np.array([t for t, _ in items], dtype=np.int64), True),
        "k": _enc_int(kinds, False),
        "o": other,
    }
    if coll:
        body["c"] = _encode_part(coll, COLL_CODECS, p.COLL_COLUMNS)
    if copy:
        body["p"] = _encode_part(copy, COPY_CODECS, p.COPY_COLUMNS)
    return _pack(body), sum(len(b) for b in coll), sum(len(b) for b in copy)


@dataclass
class DecodedChunk:
    """One chunk, columnar: what ``Recording.tables`` concatenates and ``messages`` slices."""

    recv_ns: np.ndarray  # per message
    kinds: np.ndarray  # per message (K_*)
    coll_meta: dict[str, np.ndarray]
    coll: dict[str, np.ndarray]
    copy_meta: dict[str, np.ndarray]
    copy: dict[str, np.ndarray]
    other: list[Any]  # decoded Hello / Bye / dict, in order


def decode_chunk(body: bytes | memoryview, coll_columns: Sequence[str] | None = None) -> DecodedChunk:
    try:
        doc = _unpack(body)
    except Exception as exc:
        raise _BadChunk(f"chunk body does not unpack ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise _BadChunk("chunk body is not a map")
    recv = _dec_int(doc.get("t"))
    kinds = _dec_int(doc.get("k")).astype(np.uint8)
    if len(recv) != len(kinds):
        raise _BadChunk("message table lengths differ")
    empty: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = ({}, {})
    cm, cc = _decode_part(doc["c"], COLL_CODECS, p.COLL_COLUMNS, coll_columns) if "c" in doc else empty
    pm, pc = _decode_part(doc["p"], COPY_CODECS, p.COPY_COLUMNS) if "p" in doc else empty
    other: list[Any] = []
    for kind, raw in zip(kinds[kinds >= K_HELLO], doc.get("o") or [], strict=False):
        try:
            if kind == K_HELLO:
                other.append(p.decode_hello(raw))
            elif kind == K_BYE:
                other.append(p.decode_bye(raw))
            else:
                other.append(raw)
        except p.ProtocolError as exc:
            raise _BadChunk(f"bad message in chunk: {exc}") from None
    if len(other) != int(np.count_nonzero(kinds >= K_HELLO)):
        raise _BadChunk("message count mismatch")
    if len(cm.get("n", ())) != int(np.count_nonzero(kinds == K_COLL)) or len(pm.get("n", ())) != int(
        np.count_nonzero(kinds == K_COPY)
    ):
        raise _BadChunk("batch count mismatch")
    return DecodedChunk(recv, kinds, cm, cc, pm, pc, other)


def _batches(kind: str, meta: dict[str, np.ndarray], cols: dict[str, np.ndarray]) -> list[p.Batch]:
    if not meta:
        return []
    counts = meta["n"]
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    fields = {name: meta[name].tolist() for name in BATCH_FIELDS}
    out = []
    for i in range(len(counts)):
        a, b = bounds[i], bounds[i + 1]
        out.append(
            p.Batch(
                kind=kind,
                columns={name: col[a:b] for name, col in cols.items()},
                **{name: fields[name][i] for name in BATCH_FIELDS},
            )
        )
    return out


def chunk_messages(chunk: DecodedChunk) -> list[tuple[int, Any]]:
    """The chunk's messages as the live ingest would have received them, with receive times."""
    coll = iter(_batches(p.COLL, chunk.coll_meta, chunk.coll))
    copy = iter(_batches(p.COPY, chunk.copy_meta, chunk.copy))
    other = iter(chunk.other)
    out = []
    for t, kind in zip(chunk.recv_ns.tolist(), chunk.kinds.tolist(), strict=True):
        msg = next(coll) if kind == K_COLL else next(copy) if kind == K_COPY else next(other)
        out.append((t, msg))
    return out


# --------------------------------------------------------------------------- decoded shapes


@dataclass(frozen=True)
class ChunkInfo:
    """Where one chunk lies in a file, and what its uncompressed prefix says (a reader's index)."""

    offset: int  # of the frame
    body: int  # offset of the (maybe compressed) body
    end: int
    flags: int
    first_ns: int
    last_ns: int
    messages: int
    coll_records: int
    copy_records: int

    @property
    def records(self) -> int:
        return self.coll_records + self.copy_records


@dataclass
class Tables:
    """A whole recording, columnar: collective and copy records with their rank and receive time."""

    coll: dict[str, np.ndarray]
    copy: dict[str, np.ndarray]
    hellos: list[tuple[int, p.Hello]] = field(default_factory=list)
    byes: list[tuple[int, p.Bye]] = field(default_factory=list)
    ticks: list[tuple[int, Tick]] = field(default_factory=list)  # node telemetry, decoded once
    other: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # TELEM_CAPS, ...
    #: Every chunk's collective summary rows (tui.recordings.summary), when asked for and every
    #: chunk has one; else None.
    coll_summary: dict[str, np.ndarray] | None = None
    #: What the reader's ``group_by`` gave for the collectives' (epoch, rank) columns, computed
    #: while the other columns decoded; None when not asked for, or when some chunk was decoded
    #: on its own (the columns are then not the arrays it was given).
    coll_grouped: Any = None
    #: Collective columns left encoded (the reader's ``sparse``), each a function from record
    #: positions (file order) to their values: a column a caller reads at a few records only.
    coll_at: dict[str, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)

    def coll_values(self, column: str, positions: np.ndarray) -> np.ndarray:
        """A collective column's values at ``positions`` (indices into the records in file
        order), whether it was decoded or left encoded."""
        if column in self.coll:
            return self.coll[column][positions]
        return self.coll_at[column](positions)
