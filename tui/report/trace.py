"""`commtop report FILE --trace out.json`: a Chrome/Perfetto trace of a recording.

One process per rank with two tracks (collectives, named by their stream: op, size, dtype and
process group; copies: they overlap in time, so they cannot share one), counter tracks for PCIe, NVLink and clocks of that rank's GPU (GPUs
without a rank get a process per node), and a global marker at every settings change.
Times are microseconds from the first record (``otherData.base_time_ns`` holds the start).
The file is written as a stream, so even tens of millions of events need little memory;
open it in https://ui.perfetto.dev (or chrome://tracing for small ones).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import IO, Any

import numpy as np

from tui.recordings.codec import Tables
from tui.recordings.reader import Recording
from tui.report.streams import StreamName, group_names, stream_codes, stream_name
from tui.report.views_text import size_cell
from workers.wire import protocol as p
from workers.wire.telemetry import Tick

COLL_TID, COPY_TID = 1, 2
NODE_PID = 1_000_000  # + host index: GPUs no rank claimed
BLOCK = 50_000
COUNTERS = (
    ("PCIe GB/s", ("pcie_tx_gbps", "tx"), ("pcie_rx_gbps", "rx")),
    ("NVLink GB/s", ("nvlink_tx_gbps", "tx"), ("nvlink_rx_gbps", "rx")),
    ("clocks MHz", ("sm_clock_mhz", "sm"), ("mem_clock_mhz", "mem")),
)


class _Out:
    def __init__(self, f: IO[str]) -> None:
        self.f = f
        self.count = 0

    def put(self, events: Iterable[str]) -> None:
        for text in events:
            self.f.write(",\n" if self.count else "\n")
            self.f.write(text)
            self.count += 1

    def put_many(self, texts: list[str]) -> None:
        if not texts:
            return
        self.f.write((",\n" if self.count else "\n") + ",\n".join(texts))
        self.count += len(texts)


def _meta(pid: int, name: str, sort: int, threads: dict[int, str]) -> list[str]:
    out = [
        json.dumps({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}),
        json.dumps({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": sort}}),
    ]
    out += [
        json.dumps({"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": n}})
        for t, n in threads.items()
    ]
    return out


def host_offsets_ns(coll: dict[str, np.ndarray], host_of: dict[int, str], min_common: int = 8) -> dict[str, int]:
    """{host: its clock minus the reference host's, ns}, as the live view estimates it.

    Every rank leaves one collective at (nearly) the same instant, so the end times
    (start + dur) of one iteration coincide across ranks: the median difference between a
    host's lowest rank and the reference (the lowest rank's host) is that host's offset."""
    first: dict[str, int] = {}
    for rank in sorted(host_of):
        first.setdefault(host_of[rank], rank)
    if len(first) < 2 or not len(coll["rank"]):
        return {}
    end = coll["start_ns"] + (coll["dur_us"].astype(np.float64) * 1e3).astype(np.int64)

    def ends(rank: int) -> tuple[np.ndarray, np.ndarray]:
        mine = coll["rank"] == rank
        return coll["iteration"][mine], end[mine]

    ref_it, ref_end = ends(min(first.values()))
    offsets: dict[str, int] = {}
    for host, rank in first.items():
        it, e = ends(rank)
        _, i, j = np.intersect1d(it, ref_it, return_indices=True)
        if len(i) >= min_common:
            offsets[host] = int(np.median(e[i] - ref_end[j]))
    return offsets


def _aligned(columns: dict[str, np.ndarray], host_of: dict[int, str], offsets: dict[str, int]) -> dict[str, np.ndarray]:
    """The columns with each rank's start times moved onto the reference host's clock."""
    shift = {rank: offsets.get(host, 0) for rank, host in host_of.items()}
    if not any(shift.values()) or not len(columns["rank"]):
        return columns
    lut = np.zeros(int(columns["rank"].max()) + 1, dtype=np.int64)
    for rank, ns in shift.items():
        if rank < len(lut):
            lut[rank] = ns
    return dict(columns, start_ns=columns["start_ns"] - lut[columns["rank"]])


def write_trace(rec: Recording, tables: Tables, path: str) -> int:
    """Write the trace, every host's times on the reference host's clock; returns the number
    of events."""
    hellos = {h.rank: h for _, h in tables.hellos}
    host_of = {r: h.host for r, h in hellos.items()}
    offsets = host_offsets_ns(tables.coll, host_of)
    coll, copy = _aligned(tables.coll, host_of, offsets), _aligned(tables.copy, host_of, offsets)
    starts = [a.min() for a in (coll["start_ns"], copy["start_ns"]) if len(a)]
    base = int(min(starts)) if starts else rec.first_ns
    ranks = sorted(set(np.unique(coll["rank"]).tolist()) | set(np.unique(copy["rank"]).tolist()) | set(hellos))
    gpu_pid = {(h.host, h.gpu_uuid): r for r, h in hellos.items()}
    with open(path, "w") as f:
        other = {
            "base_time_ns": base,
            "recording": rec.path,
            "complete": rec.complete,
            "problems": rec.summary(),
            "host_clock_offsets_ms": {h: ns / 1e6 for h, ns in offsets.items()},
        }
        other.update({k: rec.meta.get(k) for k in ("tool_version", "schema_version", "clock", "hosts", "world_size")})
        f.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(other, default=str) + ',"traceEvents":[')
        out = _Out(f)
        for r in ranks:
            h = hellos.get(r)
            name = f"rank {r}" + (f" · {h.host} · {_device_name(h.device, h.device_index)}" if h else "")
            out.put(_meta(r, name, r, {COLL_TID: "collectives", COPY_TID: "copies"}))
        _settings_marks(out, coll, tables, base)
        world = max((h.world_size for h in hellos.values()), default=0)
        _collectives(out, coll, base, stream_labels(coll, tables.hellos, world))
        _copies(out, copy, base)
        _counters(out, tables.ticks, gpu_pid, base, offsets)
        f.write("\n]}\n")
    return out.count


def _settings_marks(out: _Out, coll: dict[str, np.ndarray], tables: Tables, base: int) -> None:
    if not len(coll["epoch"]):
        return
    settings: dict[int, dict[str, Any]] = {}
    for _, h in tables.hellos:
        settings.setdefault(h.epoch, h.settings)
    order = np.argsort(coll["start_ns"], kind="stable")
    epochs = coll["epoch"][order]
    top = np.maximum.accumulate(epochs)
    firsts = [0, *(np.flatnonzero(top[1:] > top[:-1]) + 1).tolist()]
    for i in firsts:
        e = int(epochs[i])
        mode = p.MODES[coll["mode"][order[i]]] if coll["mode"][order[i]] < len(p.MODES) else "?"
        s = settings.get(e, {"mode": mode})
        label = f"epoch {e}: " + " ".join(f"{k}={v}" for k, v in s.items() if k != "knobs")
        ts = (int(coll["start_ns"][order[i]]) - base) / 1e3
        out.put([json.dumps({"name": label, "ph": "i", "s": "g", "ts": ts, "pid": 0, "tid": 0, "args": s})])


def stream_labels(
    coll: dict[str, np.ndarray], hellos: list[tuple[int, p.Hello]], world: int
) -> tuple[np.ndarray, list[StreamName]]:
    """Each record's stream code and each code's name (tui.report.streams)."""
    names = group_names(coll["rank"], coll["group"], hellos, world)
    codes, combos = stream_codes(names.index, coll["op"], coll["dtype"], coll["nbytes"])
    return codes, [stream_name(names, c) for c in combos]


def _collectives(
    out: _Out, coll: dict[str, np.ndarray], base: int, streams: tuple[np.ndarray, list[StreamName]]
) -> None:
    """One event per collective, named by its stream ("all_reduce 4MiB float32 · group 0:default_pg";
    no dtype where the records do not say it)."""
    modes = list(p.MODES) + ["?"] * (256 - len(p.MODES))
    codes, named = streams
    labels = [
        json.dumps(
            " ".join(w for w in (s.op, size_cell(s.nbytes), s.dtype) if w not in ("?", "-"))
            + f" · group {s.group_text}"
        )[1:-1]
        for s in named
    ]
    args = [
        f',"group":{json.dumps(s.group)},"group_desc":{json.dumps(s.group_desc)},"op":"{s.op}",'
        f'"dtype":"{s.dtype}","nbytes":{s.nbytes}'
        for s in named
    ]
    fmt = (
        '{"name":"%s","cat":"collective","ph":"X","ts":%.3f,"dur":%.3f,"pid":%d,"tid":1,'
        '"args":{"iteration":%d,"epoch":%d,"mode":"%s"%s,"MB":%.3f,"busbw_GBps":%.2f}}'
    )
    n = len(coll["dur_us"])
    for a in range(0, n, BLOCK):
        s = slice(a, a + BLOCK)
        dur = coll["dur_us"][s].astype(np.float64)
        ok = np.isfinite(dur) & (dur >= 0)
        ts = (coll["start_ns"][s][ok] - base) / 1e3
        busbw = np.nan_to_num(coll["busbw"][s][ok].astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        code = codes[s][ok].tolist()
        rows = zip(
            [labels[c] for c in code],
            ts.tolist(),
            dur[ok].tolist(),
            coll["rank"][s][ok].tolist(),
            coll["iteration"][s][ok].tolist(),
            coll["epoch"][s][ok].tolist(),
            [modes[m] for m in coll["mode"][s][ok].tolist()],
            [args[c] for c in code],
            (coll["nbytes"][s][ok] / 1e6).tolist(),
            busbw.tolist(),
            strict=True,
        )
        out.put_many([fmt % row for row in rows])


def _copies(out: _Out, copy: dict[str, np.ndarray], base: int) -> None:
    fmt = (
        '{"name":"%s","cat":"copy","ph":"X","ts":%.3f,"dur":%.3f,"pid":%d,"tid":2,'
        '"args":{"step":%d,"epoch":%d,"MB":%.3f,"GBps":%.2f}}'
    )
    n = len(copy["dur_us"])
    for a in range(0, n, BLOCK):
        s = slice(a, a + BLOCK)
        dur = copy["dur_us"][s].astype(np.float64)
        ok = np.isfinite(dur) & (dur >= 0)
        names = [
            f"{p.DIRECTIONS[d] if d < len(p.DIRECTIONS) else '?'} copy{' (pinned)' if pin else ''}"
            for d, pin in zip(copy["direction"][s][ok].tolist(), copy["pinned"][s][ok].tolist(), strict=True)
        ]
        gbps = np.nan_to_num(copy["gbps"][s][ok].astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        rows = zip(
            names,
            ((copy["start_ns"][s][ok] - base) / 1e3).tolist(),
            dur[ok].tolist(),
            copy["rank"][s][ok].tolist(),
            copy["step"][s][ok].tolist(),
            copy["epoch"][s][ok].tolist(),
            (copy["nbytes"][s][ok] / 1e6).tolist(),
            gbps.tolist(),
            strict=True,
        )
        out.put_many([fmt % row for row in rows])


def _counters(
    out: _Out,
    ticks: list[tuple[int, Tick]],
    gpu_pid: dict[tuple[str, str], int],
    base: int,
    offsets: dict[str, int],
) -> None:
    node_pids: dict[str, int] = {}
    for _, tick in ticks:
        host, uuids = tick.host, tick.uuids
        metrics = {name: values.tolist() for name, values in tick.metrics.items()}
        ts = (tick.t_ns - offsets.get(host, 0) - base) / 1e3
        events = []
        for i, uuid in enumerate(uuids):
            pid = gpu_pid.get((host, uuid))
            prefix = ""
            if pid is None:
                if host not in node_pids:
                    node_pids[host] = NODE_PID + len(node_pids)
                    out.put(_meta(node_pids[host], f"node {host} (GPUs without a rank)", node_pids[host], {}))
                pid, prefix = node_pids[host], f"GPU{i} "
            for title, *series in COUNTERS:
                args = {key: metrics[m][i] for m, key in series if m in metrics and math.isfinite(metrics[m][i])}
                if args:
                    events.append(json.dumps({"name": prefix + title, "ph": "C", "ts": ts, "pid": pid, "args": args}))
        out.put_many(events)


def _device_name(device: str, index: int) -> str:
    """ "cuda 0", or "cpu" (a CPU rank has no device index: -1 is not a name)."""
    return f"{device} {index}" if index >= 0 else device
