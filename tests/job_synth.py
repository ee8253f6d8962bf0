"""A synthetic *job* (a user's script, as the capture or the monitor API reports it) built from
real protocol objects: several process groups, ops, dtypes and sizes per step, copies, steps,
Hellos that name their groups and count lost collectives. Counts per stream are known exactly
(:func:`expected_counts`), so the streams, the step view and the report can be checked.

Per step and rank: two gradient-bucket all_reduces (float32, 1 MiB + 4 KiB and 4 MiB) and a scalar
all_reduce of the loss (float32, 4 bytes) on the world group; an all_to_all (bfloat16, 64 KiB)
in the rank's pair group; every 10th step a broadcast (int64, 8 bytes) on the world group; and
``copies`` pinned D2H copies of 4 MiB. Ranks name their groups with different codes (rank 1 lists
an unrelated group first), as torch allows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from workers.wire import protocol as p
from workers.wire.busbw import algbw_gbps, bus_factor

T0 = 1_790_000_000_000_000_000
STEP_NS = 4_500_000
#: (group name, op, dtype, nbytes, base duration in us, every n-th step)
WORLD_STREAMS = (
    ("0", "all_reduce", "float32", 1_052_672, 310.0, 1),
    ("0", "all_reduce", "float32", 4_194_304, 820.0, 1),
    ("0", "all_reduce", "float32", 4, 35.0, 1),
)
PAIR_STREAM = ("all_to_all", "bfloat16", 65_536, 120.0)
BROADCAST = ("0", "broadcast", "int64", 8, 40.0, 10)
COPY_BYTES = 4 << 20


def pair_group(rank: int) -> tuple[str, str]:
    """(name, description) of the rank's pair group: "1" for ranks 0-1, "2":"pair" for 2-3, ..."""
    k = rank // 2
    return (str(k + 1), "undefined" if k == 0 else "pair")


def groups_of(rank: int, world: int) -> tuple[tuple[str, str, int], ...]:
    name, desc = pair_group(rank)
    table: list[tuple[str, str, int]] = [("0", "default_pg", world)]
    if rank == 1:
        table.append(("9", "unrelated", 1))  # rank 1 numbers its pair group 2, rank 0 numbers it 1
    table.append((name, desc, 2))
    return tuple(table)


def job_hello(rank: int, world: int, t_ns: int, *, lost: int = 0, groups: bool = True, **config: Any) -> p.Hello:
    return p.Hello(
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
        host="node0",
        pid=2000 + rank,
        backend="gloo/cpu",
        device="cpu",
        device_index=-1,
        gpu_uuid="",
        torch_version="2.13.0",
        nccl_version="",
        config={
            "source": "monitor",
            "collective": "monitor: train.py",
            "capture": "python hooks",
            "control_unit": "step",
            "mode_knob": "",
            **config,
        },
        settings={"mode": "none", "copies": 0, "copy_scale": 1.0, "pinned": True, "direction": "d2h", "knobs": {}},
        epoch=0,
        iteration=0,
        pinned_bytes=0,
        t_ns=t_ns,
        started_ns=T0,
        groups=groups_of(rank, world) if groups else (),
        lost=lost,
    )


def _schedule(rank: int, world: int, step: int) -> list[tuple[str, str, str, int, float]]:
    """(group name, op, dtype, nbytes, base us) of the rank's collectives in ``step``, in order."""
    out = [s[:5] for s in WORLD_STREAMS]
    out.insert(2, (pair_group(rank)[0], *PAIR_STREAM))
    if step % BROADCAST[5] == 0:
        out.append(BROADCAST[:5])
    return out


def expected_counts(world: int, steps: int) -> Counter[tuple[str, str, str, int]]:
    """Records per (group name, op, dtype, nbytes), all ranks, for ``steps`` steps."""
    out: Counter[tuple[str, str, str, int]] = Counter()
    for r in range(world):
        for s in range(steps):
            for g, op, dt, nb, _ in _schedule(r, world, s):
                out[(g, op, dt, nb)] += 1
    return out


def job_run(
    world: int = 4,
    steps: int = 60,
    *,
    copies: int = 2,
    lost: dict[int, int] | None = None,
    seed: int = 3,
    steps_per_batch: int = 10,
    slow_rank: int | None = None,
) -> Iterator[tuple[int, Any]]:
    """(recv_ns, message) in arrival order. ``lost``: per rank, the Hello's lost count.
    ``slow_rank``: arrives last at every collective (waits least: the straggler)."""
    rng = np.random.default_rng(seed)
    lost = lost or {}
    code_of = {r: {g[0]: i for i, g in enumerate(groups_of(r, world))} for r in range(world)}
    out: list[tuple[int, Any]] = [(T0 + r, job_hello(r, world, T0, lost=0)) for r in range(world)]
    iteration = [0] * world
    seq = [0] * world
    cseq = [0] * world
    for lo in range(0, steps, steps_per_batch):
        t_batch = T0 + (lo + steps_per_batch) * STEP_NS
        for r in range(world):
            cols: dict[str, list[Any]] = {name: [] for name in p.COLL_COLUMNS}
            copy: dict[str, list[Any]] = {name: [] for name in p.COPY_COLUMNS}
            for s in range(lo, min(steps, lo + steps_per_batch)):
                t = T0 + s * STEP_NS + 50_000
                for k in range(copies):
                    copy["step"].append(s)
                    copy["epoch"].append(0)
                    copy["nbytes"].append(COPY_BYTES)
                    copy["direction"].append(0)
                    copy["pinned"].append(1)
                    copy["start_ns"].append(T0 + s * STEP_NS + 1_000_000 + k * 400_000)
                    copy["dur_us"].append(350.0)
                    copy["gbps"].append(0.0)
                for g, op, dt, nb, base in _schedule(r, world, s):
                    dur = float(rng.lognormal(np.log(base), 0.05))
                    if slow_rank is not None and r == slow_rank:
                        dur *= 0.8
                    for name, value in (
                        ("iteration", iteration[r]),
                        ("step", s),
                        ("epoch", 0),
                        ("mode", 0),
                        ("op", p.OP_NAMES.index(op)),
                        ("group", code_of[r][g]),
                        ("dtype", p.DTYPE_INDEX[dt]),
                        ("nbytes", nb),
                        ("host_ns", t),
                        ("start_ns", t),
                        ("dur_us", dur),
                    ):
                        cols[name].append(value)
                    iteration[r] += 1
                    t += int(dur * 1e3) + 30_000
            arrays = {name: np.asarray(cols[name], dtype=dt) for name, dt in p.COLL_COLUMNS.items() if cols[name]}
            alg = algbw_gbps(arrays["nbytes"], arrays["dur_us"])
            sizes = np.array([2 if g >= 1 else world for g in arrays["group"]])
            ops = [p.OP_NAMES[o] for o in arrays["op"]]
            factor = np.array([bus_factor(o, n) for o, n in zip(ops, sizes, strict=True)])
            arrays["algbw"] = alg.astype(np.float32)
            arrays["busbw"] = (alg * factor).astype(np.float32)
            out.append((t_batch + 100_000 + r, p.Batch(p.COLL, r, seq[r], 0, arrays, t_ns=t_batch)))
            seq[r] += 1
            if copy["step"]:
                carr = {name: np.asarray(copy[name], dtype=dt) for name, dt in p.COPY_COLUMNS.items()}
                carr["gbps"] = algbw_gbps(carr["nbytes"], carr["dur_us"]).astype(np.float32)
                out.append((t_batch + 150_000 + r, p.Batch(p.COPY, r, cseq[r], 0, carr, t_ns=t_batch)))
                cseq[r] += 1
        out += [(t_batch + 200_000 + r, job_hello(r, world, t_batch, lost=lost.get(r, 0))) for r in range(world)]
    end = T0 + (steps + 1) * STEP_NS
    out += [(end + r, p.Bye(r, 0, "done", end)) for r in range(world)]
    out.sort(key=lambda item: item[0])
    yield from out
