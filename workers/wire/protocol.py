"""The wire protocol between commtop workers, samplers, collectors and `ctl`.

Torch-free and Textual-free: `tui/` imports this module, so it may depend only on the
standard library, msgpack and numpy.

A message on the wire is two ZeroMQ frames, ``[mac, body]``:

* ``body`` is a msgpack map with ``v`` (schema version), ``k`` (kind) and ``s`` (session id);
* ``mac`` is HMAC-SHA256(key, body), checked with ``hmac.compare_digest`` *before* the body
  is unpacked, so an unauthenticated peer cannot reach the msgpack decoder at all.

Record batches are columnar: each column is the raw little-endian bytes of a numpy array
whose dtype is fixed by this schema (never sent), so the receiver decodes a batch of
thousands of records with one ``np.frombuffer`` per column.

Every decoding failure raises :class:`ProtocolError` with a short machine-readable
``reason`` (used to count rejections by reason) and a human-readable message.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

SCHEMA_VERSION = 2  # 2: collective records carry group and dtype; Hellos their groups and lost records
MAC_BYTES = 32
#: Largest body accepted; also set as ZMQ_MAXMSGSIZE on every receiving socket.
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Largest number of records in one batch (a batch is flushed long before this).
MAX_BATCH_RECORDS = 65536
MAX_STR = 4096
MAX_CONTAINER = 4096

COLLECTIVES: tuple[str, ...] = ("all_gather", "all_reduce", "reduce_scatter", "broadcast", "all_to_all")
MODES: tuple[str, ...] = ("none", "overlap", "sync", "sync-barrier")
DIRECTIONS: tuple[str, ...] = ("d2h", "h2d")
#: Names of the ``op`` column: COLLECTIVES, then ops only a monitored job reports (workers.monitor),
#: point-to-point last (a pipeline's send and recv). New names go at the end: codes never move.
OP_NAMES: tuple[str, ...] = (*COLLECTIVES, "reduce", "barrier", "gather", "scatter", "send", "recv")
#: Names of the ``dtype`` column (torch's names without "torch."); code 0: not known.
DTYPES: tuple[str, ...] = (
    "?",
    "float32",
    "bfloat16",
    "float16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
    "complex64",
    "complex128",
    "uint16",
    "uint32",
    "uint64",
)
DTYPE_INDEX: dict[str, int] = {name: i for i, name in enumerate(DTYPES)}
#: Code of the default (world) group in the ``group`` column; a rank's Hello names its groups.
WORLD_GROUP = 0
#: Largest number of process groups a rank names in its Hello (codes beyond it are not named).
MAX_GROUPS = 256


#: c10 ScalarType names (the Flight Recorder's ``input_dtypes``) -> DTYPES names.
C10_DTYPES: dict[str, str] = {
    "Float": "float32",
    "BFloat16": "bfloat16",
    "Half": "float16",
    "Double": "float64",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
}


def dtype_code(name: str) -> int:
    """The ``dtype`` code of a dtype name: torch's ("torch.bfloat16", "bfloat16") or the
    Flight Recorder's c10 names ("BFloat16", "Float"); 0 when not known."""
    key = name.removeprefix("torch.")
    return DTYPE_INDEX.get(key) or DTYPE_INDEX.get(C10_DTYPES.get(key, ""), 0)


# Kinds of message.
HELLO = "hello"  # run metadata + liveness, every second, from a worker's heartbeat thread
COLL = "coll"  # a batch of collective records
COPY = "copy"  # a batch of copy records
TELEM = "telem"  # one node telemetry tick (GPU links, clocks, host load, worker liveness)
TELEM_CAPS = "telem_caps"  # what the node sampler can measure, and why not where it cannot
BYE = "bye"  # a worker says it is exiting
CTL_STATE = "ctl_state"  # desired settings, collector -> workers, re-sent periodically
CTL_REQ = "ctl_req"  # request from `commtop ctl` or a TUI to a collector
CTL_REP = "ctl_rep"  # reply to CTL_REQ
KINDS = frozenset({HELLO, COLL, COPY, TELEM, TELEM_CAPS, BYE, CTL_STATE, CTL_REQ, CTL_REP})

#: Columns of a collective batch and their fixed wire dtypes.
COLL_COLUMNS: dict[str, str] = {
    "iteration": "<i8",  # index of the collective on this rank, from 0 after warm-up
    "step": "<i8",  # index of the step (copies + collectives_per_step collectives)
    "epoch": "<i4",  # settings epoch the collective ran with
    "mode": "u1",  # index into MODES
    "op": "u1",  # index into OP_NAMES
    "group": "<u2",  # the rank's code of the process group (its Hello's ``groups``; 0 = world)
    "dtype": "u1",  # index into DTYPES (0: not known)
    "nbytes": "<i8",  # S of nccl-tests: total (gathered) size for all_gather/reduce_scatter
    "host_ns": "<i8",  # host wall clock (time.time_ns) when the collective was issued
    "start_ns": "<i8",  # GPU start on the host wall clock (anchored event time), or host_ns on CPU
    "dur_us": "<f4",
    "algbw": "<f4",  # GB/s = nbytes / duration
    "busbw": "<f4",  # GB/s = algbw * nccl-tests factor
}
#: Columns of a copy batch.
COPY_COLUMNS: dict[str, str] = {
    "step": "<i8",
    "epoch": "<i4",
    "nbytes": "<i8",
    "direction": "u1",  # index into DIRECTIONS
    "pinned": "u1",  # 1 = pinned host memory
    "start_ns": "<i8",
    "dur_us": "<f4",
    "gbps": "<f4",
}

#: Link throughput metrics of a GPU (GB/s): what the links panel, the report and the exporter show.
LINK_METRICS: tuple[str, ...] = ("pcie_tx_gbps", "pcie_rx_gbps", "nvlink_tx_gbps", "nvlink_rx_gbps")
#: Per-GPU telemetry metrics (float64 arrays, NaN where the metric is n/a; see TELEM_CAPS).
TELEM_GPU_METRICS: tuple[str, ...] = (
    *LINK_METRICS,
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
    "power_limit_w",
    "throttle_reasons",  # bitmask of nvmlClocksEventReasons, as float
    "gpu_util_pct",
    "mem_used_bytes",
    "pcie_replay_count",
)
#: Per-GPU metrics a tick may lack (added later, or n/a on every GPU of the node): a tick
#: carries one only where some GPU has a value, and a decoded tick has NaN for a missing one,
#: so old recordings and old samplers still decode.
TELEM_GPU_OPTIONAL: tuple[str, ...] = ("dram_bw_util_pct",)  # GPM HBM bandwidth utilisation, %


class ProtocolError(ValueError):
    """A frame was rejected. ``reason`` is a short key for counting rejections."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def new_key() -> bytes:
    """A fresh 32-byte secret for signing one run's messages."""
    return secrets.token_bytes(32)


def new_session_id() -> str:
    return secrets.token_hex(8)


# --------------------------------------------------------------------------- sealing


def seal(key: bytes, body: Mapping[str, Any]) -> list[bytes]:
    """Pack and sign a message body: returns the frames to send."""
    payload = msgpack.packb(dict(body), use_bin_type=True)
    return [hmac.digest(key, payload, "sha256"), payload]


def open_frames(key: bytes, frames: list[bytes], session: str | None = None) -> dict[str, Any]:
    """Verify, then unpack one message. Raises ProtocolError; never anything else.

    The signature is checked before msgpack sees a byte. ``session`` (when given) must
    match the body's ``s``.
    """
    if len(frames) != 2:
        raise ProtocolError("frames", f"expected 2 frames, got {len(frames)}")
    mac, payload = frames
    if len(payload) > MAX_BODY_BYTES:
        raise ProtocolError("oversized", f"body of {len(payload)} bytes > {MAX_BODY_BYTES}")
    # hmac.digest: the one-shot HMAC, ~30 % cheaper than hmac.new(...).digest() (4.7 KB body, VM)
    if len(mac) != MAC_BYTES or not hmac.compare_digest(hmac.digest(key, payload, "sha256"), bytes(mac)):
        raise ProtocolError("signature", "missing or wrong HMAC-SHA256 signature")
    body = unpack_body(payload)
    if session is not None and body.get("s") != session:
        raise ProtocolError("session", "message from another session")
    return body


def unpack_body(payload: bytes) -> dict[str, Any]:
    """Unpack a msgpack body with hard limits on every container and string."""
    try:
        body = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_STR,
            max_bin_len=MAX_BODY_BYTES,
            max_array_len=MAX_CONTAINER,
            max_map_len=MAX_CONTAINER,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError("malformed", f"not a msgpack message ({type(exc).__name__})") from None
    if not isinstance(body, dict):
        raise ProtocolError("malformed", "body is not a map")
    version = body.get("v")
    if version != SCHEMA_VERSION:
        raise ProtocolError("version", f"schema version {version!r}, this commtop speaks {SCHEMA_VERSION}")
    if body.get("k") not in KINDS:
        raise ProtocolError("kind", f"unknown message kind {str(body.get('k'))[:40]!r}")
    if not isinstance(body.get("s"), str):
        raise ProtocolError("field", "missing session id")
    return body


# --------------------------------------------------------------------------- field access


def get_int(body: Mapping[str, Any], name: str, lo: int = 0, hi: int = 2**62) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ProtocolError("field", f"{name!r} must be an integer in [{lo}, {hi}]")
    return value


def get_str(body: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise ProtocolError("field", f"{name!r} must be a string")
    return value


def get_map(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name, {})
    if not isinstance(value, dict):
        raise ProtocolError("field", f"{name!r} must be a map")
    return value


# --------------------------------------------------------------------------- batches


def pick_columns(
    schema: Mapping[str, str], names: Iterable[str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``{name: dtype}`` for ``names``, in that order: each from ``schema`` (COLL_COLUMNS or
    COPY_COLUMNS), or from ``extra`` for a field that is not on the wire, so that every record
    layout (a timer's rows, a ring of the viewer) takes its dtypes from the schema.

    Raises KeyError for a name in neither, ValueError for an ``extra`` field that redefines a
    column or is not in ``names``.
    """
    names, extra = tuple(names), extra or {}
    if clash := set(extra) & set(schema):
        raise ValueError(f"extra fields redefine wire columns: {', '.join(sorted(clash))}")
    if unused := set(extra) - set(names):
        raise ValueError(f"extra fields not in names: {', '.join(sorted(unused))}")
    return {name: schema[name] if name in schema else extra[name] for name in names}


def row_dtype(schema: Mapping[str, str], names: Iterable[str], extra: Mapping[str, str] | None = None) -> np.dtype:
    """The numpy structured dtype of :func:`pick_columns` (field order = the order of the row
    tuples a timer hands over)."""
    return np.dtype(list(pick_columns(schema, names, extra).items()))


def encode_columns(columns: Mapping[str, np.ndarray], schema: Mapping[str, str]) -> dict[str, bytes]:
    """Columns as raw bytes in the schema's dtypes (cast if needed)."""
    return {name: np.ascontiguousarray(columns[name], dtype=dtype).tobytes() for name, dtype in schema.items()}


#: A schema as decoding needs it: (name, numpy dtype, bytes per value) per column.
Layout = list[tuple[str, np.dtype, int]]


def column_layout(schema: Mapping[str, str]) -> Layout:
    """``schema``'s columns with their numpy dtypes and widths."""
    return [(name, np.dtype(dtype), np.dtype(dtype).itemsize) for name, dtype in schema.items()]


def decode_columns(raw: Any, n: int, schema: Mapping[str, str] | Layout) -> dict[str, np.ndarray]:
    """Raw column bytes back into read-only numpy arrays, every length checked. ``schema`` may
    come as its :func:`column_layout` (the batch decoder's, made once: the viewer decodes ~1,500
    batches a second at 512 ranks). The loop is the viewer's per-message cost, so it is kept
    lean: a list layout skips the ABC check of a Mapping, one exact type test stands for
    ``isinstance``, and ``frombuffer`` is a local with a positional dtype (a 13-column batch
    7.5-8.9 -> 5.9 us; with the HMAC and unpacking, 22-23 -> 19-20 us a message, VM)."""
    if not isinstance(raw, dict):
        raise ProtocolError("field", "'cols' must be a map")
    layout = schema if type(schema) is list else column_layout(schema)  # type: ignore[arg-type]
    out: dict[str, np.ndarray] = {}
    frombuffer = np.frombuffer
    get = raw.get
    for name, dtype, width in layout:
        buf = get(name)
        if type(buf) is not bytes or len(buf) != n * width:
            raise _column_error(name, buf, n, width)
        out[name] = frombuffer(buf, dtype)
    return out


def _column_error(name: str, buf: Any, n: int, width: int) -> ProtocolError:
    if not isinstance(buf, bytes):
        return ProtocolError("field", f"column {name!r} missing or not bytes")
    return ProtocolError("field", f"column {name!r} holds {len(buf)} bytes, expected {n} x {width}")


@dataclass(frozen=True)
class Batch:
    """A decoded batch of collective (kind COLL) or copy (kind COPY) records of one rank.

    ``seq`` counts batches per rank from 0, so a receiver sees gaps; ``dropped`` is the
    number of records this rank could not send so far (cumulative). ``epoch_in_force`` /
    ``pending_epoch`` / ``apply_at`` report the live-control state (-1 when none).
    """

    kind: str
    rank: int
    seq: int
    dropped: int
    columns: dict[str, np.ndarray]
    epoch_in_force: int = 0
    pending_epoch: int = -1
    apply_at: int = -1
    t_ns: int = 0

    def __len__(self) -> int:
        first = next(iter(self.columns.values()), None)
        return 0 if first is None else len(first)


def batch_body(kind: str, session: str, batch: Batch) -> dict[str, Any]:
    schema = COLL_COLUMNS if kind == COLL else COPY_COLUMNS
    return {
        "v": SCHEMA_VERSION,
        "k": kind,
        "s": session,
        "rank": batch.rank,
        "seq": batch.seq,
        "dropped": batch.dropped,
        "ef": batch.epoch_in_force,
        "pe": batch.pending_epoch,
        "pa": batch.apply_at,
        "t": batch.t_ns,
        "n": len(batch),
        "cols": encode_columns(batch.columns, schema),
    }


_COLL_LAYOUT, _COPY_LAYOUT = column_layout(COLL_COLUMNS), column_layout(COPY_COLUMNS)


def decode_batch(body: Mapping[str, Any]) -> Batch:
    kind = body.get("k")
    if kind not in (COLL, COPY):
        raise ProtocolError("kind", f"{kind!r} is not a batch")
    layout = _COLL_LAYOUT if kind == COLL else _COPY_LAYOUT
    n = get_int(body, "n", 0, MAX_BATCH_RECORDS)
    return Batch(
        kind=kind,
        rank=get_int(body, "rank", 0, 1 << 20),
        seq=get_int(body, "seq"),
        dropped=get_int(body, "dropped"),
        columns=decode_columns(body.get("cols"), n, layout),
        epoch_in_force=get_int(body, "ef", -1),
        pending_epoch=get_int(body, "pe", -1),
        apply_at=get_int(body, "pa", -1),
        t_ns=get_int(body, "t"),
    )


# --------------------------------------------------------------------------- hello


@dataclass(frozen=True)
class Hello:
    """Who a rank is and what it runs; re-sent every second from a non-loop thread."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    pid: int
    backend: str  # "nccl" or "gloo/cpu" (or what the user's job uses)
    device: str  # e.g. "NVIDIA H200" or "cpu"
    device_index: int
    gpu_uuid: str
    torch_version: str
    nccl_version: str
    config: dict[str, Any]  # loop configuration (workers.wire.config.LoopConfig as a dict)
    settings: dict[str, Any]  # live settings in force (workers.wire.settings.Settings as a dict)
    epoch: int  # epoch of the settings in force
    iteration: int  # iterations finished so far
    pinned_bytes: int
    t_ns: int
    started_ns: int
    seq_coll: int = 0  # batches sent so far (lets a receiver detect loss of trailing batches)
    seq_copy: int = 0
    dropped: int = 0
    untimed: int = 0  # records whose GPU timing was dropped (event ring full)
    rejected: dict[str, int] = field(default_factory=dict)  # control messages rejected, by reason
    #: (name, description, size) of each process group, indexed by the ``group`` column's code
    groups: tuple[tuple[str, str, int], ...] = ()
    #: collectives this rank knows it issued and never recorded (cumulative; e.g. overwritten
    #: Flight Recorder entries): part of what a viewer counts as missing
    lost: int = 0
    #: the blocking collective the job is inside now: (op code, group code, nbytes, since: the
    #: rank's wall-clock ns at its call), () when none (or its capture cannot tell)
    inside: tuple[int, int, int, int] | tuple[()] = ()
    #: optimizer steps the job took so far (its global step hook); -1: not counted (the loop,
    #: a job marking its own steps, a recording made before)
    steps: int = -1

    @property
    def inside_s(self) -> float:
        """Seconds it had been inside ``inside`` when it said so (0.0: inside none)."""
        return max(0.0, (self.t_ns - self.inside[3]) / 1e9) if self.inside else 0.0


_HELLO_INTS = (
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "pid",
    "device_index",
    "epoch",
    "iteration",
    "pinned_bytes",
    "t_ns",
    "started_ns",
    "seq_coll",
    "seq_copy",
    "dropped",
    "untimed",
)
_HELLO_STRS = ("host", "backend", "device", "gpu_uuid", "torch_version", "nccl_version")


def hello_body(session: str, hello: Hello) -> dict[str, Any]:
    body: dict[str, Any] = {"v": SCHEMA_VERSION, "k": HELLO, "s": session}
    for name in _HELLO_INTS + _HELLO_STRS:
        body[name] = getattr(hello, name)
    body["config"] = hello.config
    body["settings"] = hello.settings
    body["rejected"] = hello.rejected
    body["groups"] = [list(g) for g in hello.groups[:MAX_GROUPS]]
    body["lost"] = hello.lost
    if hello.inside:
        body["inside"] = list(hello.inside)
    if hello.steps >= 0:
        body["steps"] = hello.steps
    return body


def decode_hello(body: Mapping[str, Any]) -> Hello:
    values: dict[str, Any] = {name: get_int(body, name, -1) for name in _HELLO_INTS}
    values.update({name: get_str(body, name)[:256] for name in _HELLO_STRS})
    rejected = {str(k): int(v) for k, v in get_map(body, "rejected").items() if isinstance(v, int)}
    lost = get_int(body, "lost") if "lost" in body else 0  # absent in recordings made before it
    return Hello(
        config=get_map(body, "config"),
        settings=get_map(body, "settings"),
        rejected=rejected,
        groups=_groups(body.get("groups", [])),
        lost=lost,
        inside=_inside(body.get("inside", [])),
        steps=get_int(body, "steps") if "steps" in body else -1,
        **values,
    )


def _inside(raw: Any) -> tuple[int, int, int, int] | tuple[()]:
    """A Hello's ``inside``: [op, group, nbytes, since_ns] or nothing (absent: older ranks)."""
    if raw == []:
        return ()
    if not (isinstance(raw, list) and len(raw) == 4 and all(type(v) is int and v >= 0 for v in raw)):
        raise ProtocolError("field", "'inside' must be [op, group, nbytes, since_ns]")
    return (raw[0], raw[1], raw[2], raw[3])


def _groups(raw: Any) -> tuple[tuple[str, str, int], ...]:
    """A Hello's group table: a list of [name, description, size]."""
    if not isinstance(raw, list) or len(raw) > MAX_GROUPS:
        raise ProtocolError("field", f"'groups' must be a list of at most {MAX_GROUPS} entries")
    out = []
    for g in raw:
        if not (
            isinstance(g, list)
            and len(g) == 3
            and isinstance(g[0], str)
            and isinstance(g[1], str)
            and isinstance(g[2], int)
            and not isinstance(g[2], bool)
            and 0 <= g[2] <= 1 << 24
        ):
            raise ProtocolError("field", "a 'groups' entry must be [name, description, size]")
        out.append((g[0][:256], g[1][:256], g[2]))
    return tuple(out)


# --------------------------------------------------------------------------- bye


@dataclass(frozen=True)
class Bye:
    rank: int
    exit_code: int
    reason: str
    t_ns: int


def bye_body(session: str, bye: Bye) -> dict[str, Any]:
    return {
        "v": SCHEMA_VERSION,
        "k": BYE,
        "s": session,
        "rank": bye.rank,
        "exit_code": bye.exit_code,
        "reason": bye.reason[:MAX_STR],
        "t_ns": bye.t_ns,
    }


def decode_bye(body: Mapping[str, Any]) -> Bye:
    return Bye(
        rank=get_int(body, "rank", 0, 1 << 20),
        exit_code=get_int(body, "exit_code", -255, 255),
        reason=get_str(body, "reason", ""),
        t_ns=get_int(body, "t_ns"),
    )


# --------------------------------------------------------------------------- helpers


#: A body whose typed decoder lives with its owner: TELEM and TELEM_CAPS
#: (:mod:`workers.wire.telemetry`), CTL_* (:mod:`workers.wire.control`).
RawBody = dict[str, Any]
#: What :func:`decode` returns, and what sources, the model and sinks pass along.
Message = Batch | Hello | Bye | RawBody


def decode(body: Mapping[str, Any]) -> Message:
    """Decode a verified body into its typed message (Batch, Hello, Bye, or the raw map for
    kinds whose typed decoders live with their owners: TELEM, TELEM_CAPS, CTL_*)."""
    kind = body["k"]
    if kind in (COLL, COPY):
        return decode_batch(body)
    if kind == HELLO:
        return decode_hello(body)
    if kind == BYE:
        return decode_bye(body)
    return dict(body)
