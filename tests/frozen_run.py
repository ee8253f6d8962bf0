"""Test-only helpers: hand-built (frozen) messages of a run, and a FakePublisher that sends
them as real sealed frames over real ZeroMQ (a worker stand-in whose output is exact)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from workers.wire import protocol as p
from workers.wire.busbw import bus_factor, collective_bytes
from workers.wire.connection import Connection

#: The key and session of a fake run: a FakePublisher signs with them, the app's LiveSource checks.
KEY = bytes(range(32))
SESSION = "fake-run"


def fake_connection(folder: Path) -> Connection:
    """A connection to a collector in ``folder`` with nothing but a data socket (no control,
    no request): what the app reads from, and a FakePublisher sends to."""
    return Connection(
        run_id="t",
        session=SESSION,
        key_hex=KEY.hex(),
        data=f"ipc://{folder}/data.sock",
        control="",
        request="",
        host="h",
        created_ns=0,
        path=str(folder / "connection.json"),
    )


T0 = 1_800_000_000_000_000_000  # a fixed wall clock (ns) for frozen runs
TENSOR_BYTES = 1024 * 1024 * 4
SETTINGS = {"mode": "overlap", "copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h", "knobs": {}}


def frozen_hello(rank: int, world: int = 2, *, t_ns: int = T0, backend: str = "gloo/cpu", **kw: Any) -> p.Hello:
    values: dict[str, Any] = dict(
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
        host="node-a",
        pid=1000 + rank,
        backend=backend,
        device="cpu" if backend.startswith("gloo") else "NVIDIA H200",
        device_index=-1 if backend.startswith("gloo") else rank,
        gpu_uuid="",
        torch_version="2.13.0",
        nccl_version="",
        config={
            "collective": "all_gather",
            "shape": [1024, 1024],
            "dtype": "float32",
            "tensor_bytes": TENSOR_BYTES,
            "collectives_per_step": 32,
        },
        settings=dict(SETTINGS),
        epoch=0,
        iteration=0,
        pinned_bytes=0,
        t_ns=t_ns,
        started_ns=T0,
    )
    values.update(kw)
    return p.Hello(**values)


def frozen_coll(
    rank: int,
    seq: int,
    iterations: Sequence[int],
    dur_us: Sequence[float],
    *,
    world: int = 2,
    mode: int | Sequence[int] = 1,
    epoch: int = 0,
    dropped: int = 0,
    period_ns: int = 10_000_000,
    t_ns: int | None = None,
    pending: tuple[int, int] = (-1, -1),
) -> p.Batch:
    """A collective batch; record i starts at T0 + iteration * period_ns."""
    it = np.asarray(iterations, dtype=np.int64)
    dur = np.asarray(dur_us, dtype=np.float32)
    n = len(it)
    nbytes = collective_bytes("all_gather", TENSOR_BYTES, world)
    algbw = nbytes / dur.astype(np.float64) / 1e3
    start = T0 + it * period_ns
    cols = {
        "iteration": it,
        "step": it // 32,
        "epoch": np.full(n, epoch, dtype=np.int32),
        "mode": np.broadcast_to(np.asarray(mode, dtype=np.uint8), (n,)).copy(),
        "op": np.zeros(n, dtype=np.uint8),
        "group": np.zeros(n, dtype="<u2"),
        "dtype": np.zeros(n, dtype="u1"),
        "nbytes": np.full(n, nbytes, dtype=np.int64),
        "host_ns": start,
        "start_ns": start,
        "dur_us": dur,
        "algbw": algbw.astype(np.float32),
        "busbw": (algbw * bus_factor("all_gather", world)).astype(np.float32),
    }
    last_t = int(start[-1]) if n else T0
    return p.Batch(
        p.COLL,
        rank=rank,
        seq=seq,
        dropped=dropped,
        columns=cols,
        epoch_in_force=epoch,
        pending_epoch=pending[0],
        apply_at=pending[1],
        t_ns=last_t if t_ns is None else t_ns,
    )


def frozen_copy(rank: int, seq: int, starts_ns: Sequence[int], dur_us: Sequence[float], nbytes: int) -> p.Batch:
    n = len(starts_ns)
    dur = np.asarray(dur_us, dtype=np.float32)
    cols = {
        "step": np.arange(n, dtype=np.int64),
        "epoch": np.zeros(n, dtype=np.int32),
        "nbytes": np.full(n, nbytes, dtype=np.int64),
        "direction": np.zeros(n, dtype=np.uint8),
        "pinned": np.ones(n, dtype=np.uint8),
        "start_ns": np.asarray(starts_ns, dtype=np.int64),
        "dur_us": dur,
        "gbps": (nbytes / dur.astype(np.float64) / 1e3).astype(np.float32),
    }
    return p.Batch(p.COPY, rank=rank, seq=seq, dropped=0, columns=cols, t_ns=int(starts_ns[-1]) if n else T0)


def frozen_run(world: int = 2, iterations: int = 400, batch: int = 50) -> list[Any]:
    """A deterministic run: hellos, then batches of every rank. Latency rises while the
    copies overlap (first 8 collectives of every 32-step), rank world-1 is the straggler
    (it arrives last, so it waits least), and mode switches overlap -> none half way."""
    out: list[Any] = [frozen_hello(r, world) for r in range(world)]
    seqs = [0] * world
    for lo in range(0, iterations, batch):
        its = np.arange(lo, min(lo + batch, iterations))
        for r in range(world):
            base = 2700.0 + 40.0 * r
            overlap = its < iterations // 2
            slow = overlap & ((its % 32) < 8)
            dur = base + np.where(slow, 10_000.0, 0.0) + 35.0 * np.sin(its * 0.7 + r)
            if r == world - 1:
                dur = dur - 600.0  # arrives last: waits least
            modes = np.where(overlap, 1, 0)
            out.append(frozen_coll(r, seqs[r], its, dur, world=world, mode=modes, epoch=0 if lo < 200 else 1))
            seqs[r] += 1
            if lo % 100 == 0:
                starts = T0 + its[:5] * 10_000_000
                out.append(frozen_copy(r, lo // 100, starts, [2470.0 + 10 * r] * 5, 128 * 2**20))
    return out


def seal_message(key: bytes, session: str, message: Any) -> list[bytes]:
    if isinstance(message, p.Batch):
        return p.seal(key, p.batch_body(message.kind, session, message))
    if isinstance(message, p.Hello):
        return p.seal(key, p.hello_body(session, message))
    if isinstance(message, p.Bye):
        return p.seal(key, p.bye_body(session, message))
    return p.seal(key, message)


class FakePublisher:
    """Test-only stand-in for a worker: connects PUSH to a collector and sends sealed frames."""

    def __init__(self, endpoint: str, key: bytes, session: str, *, sndhwm: int = 100_000) -> None:
        self.key = key
        self.session = session
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, sndhwm)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.connect(endpoint)

    def send(self, messages: Iterable[Any]) -> None:
        for message in messages:
            self.sock.send_multipart(seal_message(self.key, self.session, message))

    def send_frames(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close()


def frozen_snapshot(
    world: int = 8,
    iterations: int = 600,
    *,
    stale: int | None = None,
    exited: int | None = None,
    gpus: int = 0,
    nvlink: bool = False,
):
    """A model fed ``frozen_run`` and snapshotted at a fixed time: the same picture every run.

    ``stale``: this rank stops reporting at 80 % of the run; ``exited``: this rank says Bye.
    ``gpus``: ranks 0..gpus-1 sit on H200s whose NVML ticks (tests/frozen_links.py) end with
    the run, so the links panel has something to draw.
    """
    from dataclasses import replace

    from frozen_links import fixture_ticks, gpu_uuid

    from tui.model.run_model import RunModel

    clock_t = [T0]
    model = RunModel(clock=lambda: clock_t[0])
    cut = int(iterations * 0.8)
    for m in frozen_run(world=world, iterations=iterations):
        if isinstance(m, p.Batch) and m.rank == stale and m.t_ns >= T0 + cut * 10_000_000:
            continue
        if isinstance(m, p.Batch) and m.kind == p.COLL:
            clock_t[0] = max(clock_t[0], int(m.columns["start_ns"][-1]))
        if isinstance(m, p.Hello) and m.rank < gpus:
            m = replace(m, backend="nccl", device="NVIDIA H200", device_index=m.rank, gpu_uuid=gpu_uuid(m.rank))
        model.apply(m)
    if gpus:
        from workers.wire.telemetry import Caps, caps_body, tick_body

        for m in fixture_ticks("node-a", clock_t[0], gpus, nvlink=nvlink):  # as the wire delivers them
            model.apply(caps_body("s", m) if isinstance(m, Caps) else tick_body("s", m))
    if exited is not None:
        model.apply(p.Bye(rank=exited, exit_code=1, reason="RuntimeError: NCCL timeout", t_ns=clock_t[0] + 1))
    return model.snapshot(clock_t[0] + 1_000_000_000)
