"""``python -m workers.synthetic.selfcheck``: the instrumented loop on this machine's GPU (world size 1,
in-process), once per offload mode, through the real publisher and a real collector socket;
prints what the records say. A quick check that the CUDA path works end to end.

Without a GPU it runs the same on CPU/gloo (smaller default tensor), which is what CI tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import threading
from typing import Any

import numpy as np
import zmq

from workers.rank.control import StaticControl
from workers.wire import protocol
from workers.wire.config import LoopConfig, parse_shape
from workers.wire.connection import RUNTIME_DIR_ENV, Connection, create_run
from workers.wire.protocol import COLL, COLLECTIVES, COPY, MODES, Batch, Bye


class Receiver(threading.Thread):
    """The collector's side of ``data`` for one run: keeps every message until the Bye."""

    def __init__(self, conn: Connection) -> None:
        super().__init__(daemon=True)
        self.conn = conn
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES)
        self.sock.setsockopt(zmq.RCVHWM, 100000)
        self.sock.bind(conn.data)
        self.msgs: list[Any] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if self.sock.poll(100):
                frames = self.sock.recv_multipart()
                msg = protocol.decode(protocol.open_frames(self.conn.key, frames, self.conn.session))
                self.msgs.append(msg)
                if isinstance(msg, Bye):
                    self.done.set()
        self.sock.close(linger=0)
        self.ctx.term()

    def columns(self, kind: str) -> dict[str, np.ndarray]:
        batches = [m for m in self.msgs if isinstance(m, Batch) and m.kind == kind]
        schema = protocol.COLL_COLUMNS if kind == COLL else protocol.COPY_COLUMNS
        return {c: np.concatenate([b.columns[c] for b in batches] or [np.zeros(0, d)]) for c, d in schema.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fmt(values: np.ndarray, q: float, scale: float = 1.0) -> str:
    return f"{np.percentile(values, q) * scale:9.3f}" if len(values) else f"{'-':>9}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.synthetic.selfcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--collective", choices=COLLECTIVES, default="all_gather")
    parser.add_argument("--shape", default=None, help="default 8192x8192 bf16 on GPU, 1024x1024 fp32 on CPU")
    parser.add_argument("--iters", type=int, default=96)
    parser.add_argument("--copies", type=int, default=5)
    parser.add_argument("--collectives-per-step", type=int, default=32)
    parser.add_argument("--modes", default=",".join(MODES))
    ns = parser.parse_args(argv)
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    own_root = "" if os.environ.get(RUNTIME_DIR_ENV) else tempfile.mkdtemp(prefix="commtop-selfcheck-")
    if own_root:
        os.environ[RUNTIME_DIR_ENV] = own_root
    try:
        return _check_modes(ns)
    finally:  # each mode's run folder goes with it; the folder made for them too
        if own_root:
            shutil.rmtree(own_root, ignore_errors=True)
            os.environ.pop(RUNTIME_DIR_ENV, None)


def _check_modes(ns: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from workers.synthetic.loop import Runtime, run_worker

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(0)
        try:
            dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        except TypeError:
            dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    rt = Runtime(0, 1, 0, 1, cuda=cuda, backend="nccl" if cuda else "gloo/cpu", device_index=0 if cuda else -1)
    shape = parse_shape(ns.shape) if ns.shape else ((8192, 8192) if cuda else (1024, 1024))
    dtype = "bfloat16" if cuda else "float32"
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"commtop selfcheck: {device}, {rt.backend}, torch {torch.__version__}, {ns.collective} {shape} {dtype}")
    print(
        f"{'mode':<13}{'colls':>6}{'p50 ms':>9}{'p99 ms':>9}{'algbw':>9}{'busbw':>9}"
        f"{'copies':>7}{'copy GB/s':>10}{'dropped':>8}{'untimed':>8}  exit"
    )
    worst = 0
    for mode in ns.modes.split(","):
        config = LoopConfig(
            collective=ns.collective,
            shape=shape,
            dtype=dtype,
            offload=mode,
            copies=ns.copies,
            collectives_per_step=ns.collectives_per_step,
            iters=ns.iters,
            warmup=5,
            backend="nccl" if cuda else "gloo",
        )
        conn = create_run(label=f"selfcheck-{mode}")
        try:
            receiver = Receiver(conn)
            receiver.start()
            result = run_worker(config, rt, conn, StaticControl(config.initial_settings()))
            receiver.done.wait(5.0)
            receiver.done.set()
            receiver.join(2.0)
        finally:
            shutil.rmtree(conn.run_dir, ignore_errors=True)
        coll, copy = receiver.columns(COLL), receiver.columns(COPY)
        ms = coll["dur_us"].astype(np.float64) / 1000
        complete = coll["iteration"].tolist() == list(range(ns.iters))
        worst = max(worst, result.exit_code, 0 if complete else 3)
        print(
            f"{mode:<13}{len(ms):>6}{_fmt(ms, 50)}{_fmt(ms, 99)}{_fmt(coll['algbw'], 50)}{_fmt(coll['busbw'], 50)}"
            f"{len(copy['step']):>7}{_fmt(copy['gbps'], 50):>10}{result.summary.get('dropped', 0):>8}"
            f"{result.summary.get('untimed', 0):>8}  {result.exit_code}{'' if complete else ' (iterations missing!)'}",
            flush=True,
        )
    dist.destroy_process_group()
    print("GB/s = 1e9 B/s (nccl-tests convention); busbw is 0 at world size 1 for all_gather/all_reduce.")
    return worst


if __name__ == "__main__":
    sys.exit(main())
