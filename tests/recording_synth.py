"""Synthetic runs built from real protocol objects (Batch, Hello, Bye, TELEM bodies), for the
recording/replay/report tests and benchmarks/standing/_synth_recording.py.

A run looks like the forum's: ranks time an all_gather every ~2.7 ms, batches leave every
50 ms, each rank says Hello once a second, a node sampler ticks at 10 Hz; the settings epoch
changes at given times (mode none -> overlap -> sync ...), and slower modes take longer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workers.wire import protocol as p
from workers.wire.busbw import algbw_gbps, bus_factor

T0 = 1_764_600_000_000_000_000  # 2025-12-01, in ns
TENSOR = 128 * 1024 * 1024
SLOWDOWN = {"none": 1.0, "overlap": 3.0, "sync": 1.6, "sync-barrier": 1.1}


@dataclass(frozen=True)
class Epoch:
    start_s: float
    mode: str
    copies: int = 5
    pinned: bool = True
    direction: str = "d2h"


DEFAULT_EPOCHS = (Epoch(0.0, "none", copies=0), Epoch(2.0, "overlap"), Epoch(4.0, "sync"))


def hello(rank: int, world: int, epoch: int, ep: Epoch, t_ns: int, iteration: int = 0) -> p.Hello:
    settings = {"mode": ep.mode, "copies": ep.copies, "copy_scale": 1.0, "pinned": ep.pinned}
    return p.Hello(
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
        host="node0",
        pid=1000 + rank,
        backend="nccl",
        device="NVIDIA H200",
        device_index=rank,
        gpu_uuid=f"GPU-{rank:04d}",
        torch_version="2.11.0",
        nccl_version="2.28.9",
        config={"collective": "all_gather", "shape": [8192, 8192], "dtype": "bfloat16", "tensor_bytes": TENSOR},
        settings={**settings, "direction": ep.direction, "knobs": {}},
        epoch=epoch,
        iteration=iteration,
        pinned_bytes=TENSOR * 5,
        t_ns=t_ns,
        started_ns=T0,
    )


def telem(world: int, t_ns: int, seq: int, pcie: float, sm_mhz: float) -> dict[str, Any]:
    """A TELEM body as the node sampler sends it (workers.wire.telemetry.tick_body layout)."""
    n = world

    def arr(v: float) -> bytes:
        return np.full(n, v, dtype="<f8").tobytes()

    metrics = {name: arr(np.nan) for name in p.TELEM_GPU_METRICS}
    metrics.update(
        pcie_tx_gbps=arr(pcie),
        pcie_rx_gbps=arr(pcie / 10),
        sm_clock_mhz=arr(sm_mhz),
        mem_clock_mhz=arr(2619.0),
        power_w=arr(300.0 + pcie),
    )
    return {
        "v": p.SCHEMA_VERSION,
        "k": p.TELEM,
        "s": "",
        "host": "node0",
        "pid": 999,
        "seq": seq,
        "t": t_ns,
        "cost_us": 450.0,
        "uuids": [f"GPU-{r:04d}" for r in range(n)],
        "m": metrics,
        "gcost": arr(50.0),
        "pcie_peak": arr(63.0),
        "nvl_peak": arr(np.nan),
        "cpu": 12.5,
        "mem_used": 1 << 34,
        "mem_total": 1 << 38,
        "procs": [[1000 + r, "running", 99.0, 1 << 30] for r in range(n)],
        "nvml": "",
        "dropped": 0,
    }


def synth_run(
    duration_s: float = 6.0,
    world: int = 4,
    epochs: Sequence[Epoch] = DEFAULT_EPOCHS,
    base_us: float = 2700.0,
    batch_ms: float = 50.0,
    telemetry: bool = True,
    seed: int = 0,
) -> Iterator[tuple[int, Any]]:
    """(recv_ns, message) in arrival order, like a collector would have received them."""
    rng = np.random.default_rng(seed)
    nbytes = TENSOR * world
    factor = bus_factor("all_gather", world)
    end_ns = T0 + int(duration_s * 1e9)
    starts = [T0 + int(e.start_s * 1e9) for e in epochs]

    def epoch_at(t: int) -> int:
        return int(np.searchsorted(starts, t, side="right") - 1)

    clock = [T0 + int(rng.integers(0, 100_000)) for _ in range(world)]  # next start_ns per rank
    iteration = [0] * world
    seq = [0] * world
    seq_copy = [0] * world
    next_batch = T0 + int(batch_ms * 1e6)
    next_hello = T0
    next_telem = T0
    tick = 0
    while next_batch <= end_ns:
        out: list[tuple[int, Any]] = []
        while next_hello <= next_batch:
            e = epoch_at(next_hello)
            out += [
                (next_hello + 300_000 + r, hello(r, world, e, epochs[e], next_hello, iteration[r]))
                for r in range(world)
            ]
            next_hello += 1_000_000_000
        while telemetry and next_telem <= next_batch:
            e = epochs[epoch_at(next_telem)]
            pcie = 0.0 if e.copies == 0 else 54.0
            out.append((next_telem + 1_000_000, telem(world, next_telem, tick, pcie, 1980.0 - 10 * (e.mode != "none"))))
            tick += 1
            next_telem += 100_000_000
        for r in range(world):
            cols: dict[str, list[Any]] = {name: [] for name in p.COLL_COLUMNS}
            copies: dict[str, list[Any]] = {name: [] for name in p.COPY_COLUMNS}
            while clock[r] < next_batch:
                e = epoch_at(clock[r])
                ep = epochs[e]
                step = iteration[r] // 32
                if iteration[r] % 32 == 0 and ep.copies:
                    for _ in range(ep.copies):
                        cdur = float(rng.lognormal(np.log(2470.0 if ep.pinned else 10800.0), 0.05))
                        copies["step"].append(step)
                        copies["epoch"].append(e)
                        copies["nbytes"].append(TENSOR)
                        copies["direction"].append(p.DIRECTIONS.index(ep.direction))
                        copies["pinned"].append(int(ep.pinned))
                        copies["start_ns"].append(clock[r] + int(rng.integers(0, 10_000)))
                        copies["dur_us"].append(cdur)
                        copies["gbps"].append(0.0)
                dur = float(rng.lognormal(np.log(base_us * SLOWDOWN[ep.mode]), 0.08))
                host = clock[r] - int(rng.integers(5_000, 40_000))
                for name, value in (
                    ("iteration", iteration[r]),
                    ("step", step),
                    ("epoch", e),
                    ("mode", p.MODES.index(ep.mode)),
                    ("op", 0),
                    ("group", 0),
                    ("dtype", 0),
                    ("nbytes", nbytes),
                    ("host_ns", host),
                    ("start_ns", clock[r]),
                    ("dur_us", dur),
                ):
                    cols[name].append(value)
                iteration[r] += 1
                clock[r] += int(dur * 1000) + int(rng.integers(2_000, 30_000))
            if cols["iteration"]:
                arrays = {name: np.asarray(cols[name], dtype=dt) for name, dt in p.COLL_COLUMNS.items() if cols[name]}
                alg = algbw_gbps(arrays["nbytes"], arrays["dur_us"]).astype(np.float32)
                arrays["algbw"] = alg
                arrays["busbw"] = (alg * factor).astype(np.float32)
                batch = p.Batch(p.COLL, r, seq[r], 0, arrays, epoch_in_force=epoch_at(next_batch), t_ns=next_batch)
                out.append((next_batch + 200_000 + 1000 * r, batch))
                seq[r] += 1
            if copies["step"]:
                arrays = {name: np.asarray(copies[name], dtype=dt) for name, dt in p.COPY_COLUMNS.items()}
                arrays["gbps"] = algbw_gbps(arrays["nbytes"], arrays["dur_us"]).astype(np.float32)
                batch = p.Batch(p.COPY, r, seq_copy[r], 0, arrays, epoch_in_force=epoch_at(next_batch), t_ns=next_batch)
                out.append((next_batch + 250_000 + 1000 * r, batch))
                seq_copy[r] += 1
        out.sort(key=lambda item: item[0])
        yield from out
        next_batch += int(batch_ms * 1e6)
    yield end_ns + 1_000_000, p.Bye(0, 0, "done", end_ns)


def write_recording(path: Any, items: Sequence[tuple[int, Any]], chunk_s: float = 0.5, close: bool = True) -> None:
    """Write ``items`` with the real writer, one chunk per ``chunk_s`` of receive time."""
    from tui.recordings.writer import RecordingWriter, run_metadata

    hellos = {m.rank: m for _, m in items if isinstance(m, p.Hello)}
    writer = RecordingWriter(open(path, "wb"), {"schema_version": p.SCHEMA_VERSION, **run_metadata(hellos)})
    chunk: list[tuple[int, Any]] = []
    for t, msg in items:
        if chunk and t - chunk[0][0] >= chunk_s * 1e9:
            writer.write_chunk(chunk)
            chunk = []
        chunk.append((t, msg))
    writer.write_chunk(chunk)
    if close:
        writer.close({"complete": True})
    else:
        writer.flush()


def assert_same_message(a: Any, b: Any) -> None:
    """Messages equal field by field; batch columns equal bit for bit in their dtypes."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, p.Batch):
        assert (a.kind, a.rank, a.seq, a.dropped, a.epoch_in_force, a.pending_epoch, a.apply_at, a.t_ns) == (
            b.kind,
            b.rank,
            b.seq,
            b.dropped,
            b.epoch_in_force,
            b.pending_epoch,
            b.apply_at,
            b.t_ns,
        )
        assert set(a.columns) == set(b.columns)
        for name in a.columns:
            x, y = np.asarray(a.columns[name]), np.asarray(b.columns[name])
            assert x.dtype == y.dtype, name
            assert x.tobytes() == y.tobytes(), name
    else:
        assert _dict_equal(a, b), (a, b)


def _dict_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_dict_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_dict_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b, equal_nan=True)
    return bool(a == b)
