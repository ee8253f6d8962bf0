"""A job that starts its own ranks (the PyTorch tutorials' shapes), nothing of commtop in it.

    python tests/jobs/spawned_ranks.py --ranks 2 --counts /tmp/c
    commtop run --headless --nproc 1 --record x.commtop -- python tests/jobs/spawned_ranks.py --counts /tmp/c

``--start mp.spawn`` (the DDP tutorial's torch.multiprocessing.spawn, a tcp:// rendezvous), or
``spawn`` / ``fork`` ("Writing Distributed Applications": multiprocessing.Process with that start
method, MASTER_ADDR/MASTER_PORT set in the child, env://); ``--subclass``: a Process subclass with
its own ``run``; ``--launcher-is-rank0``: the script's own process is rank 0 and starts the others. Each rank joins a gloo group with its index as its rank and, per step, all_reduces a
float32 tensor of 64 elements, broadcasts a float64 one of 16 from rank 0 and all_gathers an int32
one of 8. It counts what it issues from its own logic, per (group name, op, dtype, nbytes as
nccl-tests count them), and writes the counts to ``PREFIX.rankN.json``
(tests/test_job_streams_recorded.py compares a recording with it).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# bound by name, as many scripts do: a spawned rank imports this script before commtop runs in it
from torch.distributed import all_reduce, init_process_group


def rank_main(rank: int, world: int, port: int, steps: int, counts: str) -> None:
    init = f"tcp://127.0.0.1:{port}" if port else "env://"
    init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    group = dist.distributed_c10d._get_process_group_name(dist.group.WORLD)
    issued: collections.Counter[tuple[str, str, str, int]] = collections.Counter()
    for _step in range(steps):
        t = torch.ones(64)
        all_reduce(t)
        issued[(group, "all_reduce", "float32", t.nbytes)] += 1
        b = torch.ones(16, dtype=torch.float64)
        dist.broadcast(b, src=0)
        issued[(group, "broadcast", "float64", b.nbytes)] += 1
        g = torch.ones(8, dtype=torch.int32)
        dist.all_gather_into_tensor(torch.empty(8 * world, dtype=torch.int32), g)
        issued[(group, "all_gather", "int32", g.nbytes * world)] += 1
    if counts:
        with open(f"{counts}.rank{rank}.json", "w") as f:
            json.dump([[*key, n] for key, n in sorted(issued.items())], f)
    dist.destroy_process_group()


def as_tutorial(rank: int, world: int, port: int, steps: int, counts: str) -> None:
    """The "Writing Distributed Applications" tutorial's ``init_process``: env:// rendezvous."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    rank_main(rank, world, 0, steps, counts)


class RankProcess(mp.Process):
    """A rank as a Process subclass with its own ``run`` (no target)."""

    def __init__(self, rank: int, job: tuple[int, int, int, str]) -> None:
        super().__init__()
        self.rank, self.job = rank, job

    def run(self) -> None:
        as_tutorial(self.rank, *self.job)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--counts", default="", help="write each rank's counts to PREFIX.rankN.json")
    ap.add_argument(
        "--start",
        choices=("mp.spawn", "spawn", "fork"),
        default="mp.spawn",
        help="torch.multiprocessing.spawn, or multiprocessing.Process with the spawn or fork method",
    )
    ap.add_argument("--launcher-is-rank0", action="store_true", help="with --start spawn|fork: this process is rank 0")
    ap.add_argument("--subclass", action="store_true", help="with --start spawn|fork: a Process subclass's run()")
    args = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    job = (args.ranks, port, args.steps, args.counts)
    if args.start == "mp.spawn":
        mp.spawn(rank_main, args=job, nprocs=args.ranks)
    else:
        mp.set_start_method(args.start)  # the default context: Process and its subclasses
        first = 1 if args.launcher_is_rank0 else 0
        ranks = range(first, args.ranks)
        processes = (
            [RankProcess(r, job) for r in ranks]
            if args.subclass
            else [mp.Process(target=as_tutorial, args=(r, *job)) for r in ranks]
        )
        for p in processes:
            p.start()
        if args.launcher_is_rank0:
            as_tutorial(0, *job)
        for p in processes:
            p.join()
        if any(p.exitcode for p in processes):
            print(f"spawned_ranks: exit codes {[p.exitcode for p in processes]}", flush=True)
            return 1
    print(f"spawned_ranks: {args.ranks} ranks, {args.steps} steps, {args.start} (pid {os.getpid()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
