"""TELEM / TELEM_CAPS bodies: typed records, encode, decode with validation.

Torch-free and zmq-free (``tui`` imports it). Per-GPU metrics travel as raw little-endian
float64 arrays (one per name in ``protocol.TELEM_GPU_METRICS``, plus the optional
``TELEM_GPU_OPTIONAL`` ones where some GPU has a value) with NaN where a metric is n/a; *why* it is n/a travels once a second in TELEM_CAPS, so a 10 Hz tick stays small.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.wire import protocol
from workers.wire.protocol import ProtocolError, get_int, get_str

MAX_GPUS = 64
MAX_PROCS = 512
_NAME = 256
#: Longest Prometheus endpoint URL a node may report.
_URL = 300

PROC_STATUSES: tuple[str, ...] = ("running", "sleeping", "stopped", "zombie", "gone")


@dataclass(frozen=True)
class ProcInfo:
    """One worker process as the node sampler saw it (``status`` is one of PROC_STATUSES)."""

    pid: int
    status: str
    cpu_pct: float
    rss_bytes: int


@dataclass(frozen=True)
class Tick:
    """One 10 Hz node telemetry sample."""

    host: str
    pid: int  # the sampler's pid
    seq: int
    t_ns: int
    cost_us: float  # wall time the whole tick took (NVML + psutil + encode)
    uuids: tuple[str, ...]
    metrics: dict[str, np.ndarray]  # name -> float64[len(uuids)], NaN = n/a
    gpu_cost_us: np.ndarray  # float64[len(uuids)]: NVML time per GPU this tick
    pcie_peak_gbps: np.ndarray  # from the current PCIe gen x width (links downshift when idle)
    nvlink_peak_gbps: np.ndarray
    cpu_pct: float  # node total, 0-100
    mem_used_bytes: int
    mem_total_bytes: int
    procs: tuple[ProcInfo, ...] = ()
    nvml: str = ""  # "" when NVML works, else why not ("NVML not available")
    dropped: int = 0  # ticks this sampler could not send so far


@dataclass(frozen=True)
class GpuCaps:
    """What one GPU can report and from where; ``na`` gives each n/a metric's reason."""

    uuid: str
    index: int
    name: str
    pcie_gen: int
    pcie_width: int
    pcie_peak_gbps: float
    nvlink_links: int
    nvlink_peak_gbps: float  # NaN without NVLink
    sources: dict[str, str] = field(default_factory=dict)  # metric -> "gpm" | "field" | ...
    na: dict[str, str] = field(default_factory=dict)  # metric -> reason


@dataclass(frozen=True)
class Caps:
    """Sent every second: the node's capabilities and reasons (lets a late TUI catch up)."""

    host: str
    pid: int
    t_ns: int
    interval_s: float
    nvml: str  # "" when NVML works
    driver: str
    gpus: tuple[GpuCaps, ...]
    notes: tuple[str, ...] = ()
    #: the node's Prometheus endpoint ("" when it serves none): `commtop ctl status` lists every
    #: node's, also those of other machines, whose URL files are not beside the head's connection file
    prometheus: str = ""


# --------------------------------------------------------------------------- encode


def _f8(values: Any, n: int) -> bytes:
    arr = np.ascontiguousarray(values, dtype="<f8")
    if arr.shape != (n,):
        raise ValueError(f"expected {n} values, got shape {arr.shape}")
    return arr.tobytes()


def tick_body(session: str, tick: Tick) -> dict[str, Any]:
    n = len(tick.uuids)
    nan = np.full(n, np.nan)
    return {
        "v": protocol.SCHEMA_VERSION,
        "k": protocol.TELEM,
        "s": session,
        "host": tick.host[:_NAME],
        "pid": tick.pid,
        "seq": tick.seq,
        "t": tick.t_ns,
        "cost_us": float(tick.cost_us),
        "uuids": [u[:_NAME] for u in tick.uuids[:MAX_GPUS]],
        "m": {name: _f8(tick.metrics.get(name, nan), n) for name in protocol.TELEM_GPU_METRICS}
        | {
            name: _f8(tick.metrics[name], n)
            for name in protocol.TELEM_GPU_OPTIONAL
            if name in tick.metrics and np.isfinite(tick.metrics[name]).any()
        },
        "gcost": _f8(tick.gpu_cost_us, n),
        "pcie_peak": _f8(tick.pcie_peak_gbps, n),
        "nvl_peak": _f8(tick.nvlink_peak_gbps, n),
        "cpu": float(tick.cpu_pct),
        "mem_used": int(tick.mem_used_bytes),
        "mem_total": int(tick.mem_total_bytes),
        "procs": [[p.pid, p.status, float(p.cpu_pct), int(p.rss_bytes)] for p in tick.procs[:MAX_PROCS]],
        "nvml": tick.nvml[: protocol.MAX_STR],
        "dropped": tick.dropped,
    }


def caps_body(session: str, caps: Caps) -> dict[str, Any]:
    return {
        "v": protocol.SCHEMA_VERSION,
        "k": protocol.TELEM_CAPS,
        "s": session,
        "host": caps.host[:_NAME],
        "pid": caps.pid,
        "t": caps.t_ns,
        "interval_s": float(caps.interval_s),
        "nvml": caps.nvml[: protocol.MAX_STR],
        "driver": caps.driver[:_NAME],
        "gpus": [
            {
                "uuid": g.uuid[:_NAME],
                "index": g.index,
                "name": g.name[:_NAME],
                "pcie_gen": g.pcie_gen,
                "pcie_width": g.pcie_width,
                "pcie_peak": float(g.pcie_peak_gbps),
                "nvl_links": g.nvlink_links,
                "nvl_peak": float(g.nvlink_peak_gbps),
                "src": {k[:_NAME]: v[:_NAME] for k, v in list(g.sources.items())[:64]},
                "na": {k[:_NAME]: v[:1024] for k, v in list(g.na.items())[:64]},
            }
            for g in caps.gpus[:MAX_GPUS]
        ],
        "notes": [n[:1024] for n in caps.notes[:32]],
        "prometheus": caps.prometheus[:_URL],
    }


# --------------------------------------------------------------------------- decode


def _float(body: Mapping[str, Any], name: str, default: float | None = None) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError("field", f"{name!r} must be a number")
    return float(value)


def _array(raw: Any, name: str, n: int) -> np.ndarray:
    if not isinstance(raw, bytes) or len(raw) != 8 * n:
        raise ProtocolError("field", f"telemetry array {name!r} must be {n} float64 values")
    return np.frombuffer(raw, dtype="<f8")


def _str_list(value: Any, name: str, limit: int) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > limit or not all(isinstance(v, str) for v in value):
        raise ProtocolError("field", f"{name!r} must be a list of at most {limit} strings")
    return tuple(v[:_NAME] for v in value)


def _str_map(value: Any, name: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ProtocolError("field", f"{name!r} must be a map of strings")
    return dict(value)


def decode_tick(body: Mapping[str, Any]) -> Tick:
    """A verified TELEM body into a Tick; ProtocolError on anything malformed."""
    if body.get("k") != protocol.TELEM:
        raise ProtocolError("kind", f"{body.get('k')!r} is not a telemetry tick")
    uuids = _str_list(body.get("uuids"), "uuids", MAX_GPUS)
    n = len(uuids)
    raw = body.get("m")
    if not isinstance(raw, dict):
        raise ProtocolError("field", "'m' must be a map")
    metrics = {name: _array(raw.get(name), name, n) for name in protocol.TELEM_GPU_METRICS}
    for name in protocol.TELEM_GPU_OPTIONAL:  # absent: an older sender, or n/a on every GPU
        metrics[name] = _array(raw[name], name, n) if name in raw else np.full(n, np.nan)
    raw_procs = body.get("procs", [])
    if not isinstance(raw_procs, list) or len(raw_procs) > MAX_PROCS:
        raise ProtocolError("field", f"'procs' must be a list of at most {MAX_PROCS}")
    procs = []
    for p in raw_procs:
        if (
            not isinstance(p, list)
            or len(p) != 4
            or not isinstance(p[0], int)
            or p[1] not in PROC_STATUSES
            or isinstance(p[2], bool)
            or not isinstance(p[2], (int, float))
            or not isinstance(p[3], int)
        ):
            raise ProtocolError("field", "'procs' entries must be [pid, status, cpu_pct, rss]")
        procs.append(ProcInfo(pid=p[0], status=p[1], cpu_pct=float(p[2]), rss_bytes=p[3]))
    cpu = _float(body, "cpu")
    return Tick(
        host=get_str(body, "host")[:_NAME],
        pid=get_int(body, "pid"),
        seq=get_int(body, "seq"),
        t_ns=get_int(body, "t"),
        cost_us=_float(body, "cost_us"),
        uuids=uuids,
        metrics=metrics,
        gpu_cost_us=_array(body.get("gcost"), "gcost", n),
        pcie_peak_gbps=_array(body.get("pcie_peak"), "pcie_peak", n),
        nvlink_peak_gbps=_array(body.get("nvl_peak"), "nvl_peak", n),
        cpu_pct=cpu if math.isfinite(cpu) else math.nan,
        mem_used_bytes=get_int(body, "mem_used"),
        mem_total_bytes=get_int(body, "mem_total"),
        procs=tuple(procs),
        nvml=get_str(body, "nvml", ""),
        dropped=get_int(body, "dropped"),
    )


def decode_caps(body: Mapping[str, Any]) -> Caps:
    """A verified TELEM_CAPS body into Caps; ProtocolError on anything malformed."""
    if body.get("k") != protocol.TELEM_CAPS:
        raise ProtocolError("kind", f"{body.get('k')!r} is not telemetry capabilities")
    raw_gpus = body.get("gpus")
    if not isinstance(raw_gpus, list) or len(raw_gpus) > MAX_GPUS:
        raise ProtocolError("field", f"'gpus' must be a list of at most {MAX_GPUS}")
    gpus = []
    for g in raw_gpus:
        if not isinstance(g, dict):
            raise ProtocolError("field", "'gpus' entries must be maps")
        gpus.append(
            GpuCaps(
                uuid=get_str(g, "uuid")[:_NAME],
                index=get_int(g, "index", -1, 1 << 16),
                name=get_str(g, "name")[:_NAME],
                pcie_gen=get_int(g, "pcie_gen", -1, 64),
                pcie_width=get_int(g, "pcie_width", -1, 64),
                pcie_peak_gbps=_float(g, "pcie_peak"),
                nvlink_links=get_int(g, "nvl_links", -1, 1024),
                nvlink_peak_gbps=_float(g, "nvl_peak"),
                sources=_str_map(g.get("src", {}), "src"),
                na=_str_map(g.get("na", {}), "na"),
            )
        )
    return Caps(
        host=get_str(body, "host")[:_NAME],
        pid=get_int(body, "pid"),
        t_ns=get_int(body, "t"),
        interval_s=_float(body, "interval_s"),
        nvml=get_str(body, "nvml", ""),
        driver=get_str(body, "driver", "")[:_NAME],
        gpus=tuple(gpus),
        notes=_str_list(body.get("notes", []), "notes", 32),
        prometheus=get_str(body, "prometheus", "")[:_URL],
    )
