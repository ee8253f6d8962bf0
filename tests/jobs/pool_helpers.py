"""A torchrun job whose ranks use multiprocessing helpers (a fork pool, a spawn Process) before
their process group exists and after, nothing of commtop in it.

    commtop run --headless --nproc 2 --record x.commtop -- python tests/jobs/pool_helpers.py --counts /tmp/c

Helpers never make a process group: they are no ranks of the run, and a forked one must not
speak for the rank it was forked from. Per step each rank all_reduces a float32 tensor of 32
elements; it counts what it issues per (group name, op, dtype, nbytes) into ``PREFIX.rankN.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import sys

import torch
import torch.distributed as dist


def square(x: int) -> int:
    return x * x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--counts", default="")
    args = ap.parse_args(argv)
    with mp.get_context("fork").Pool(2) as pool:  # before the group: the process may look like a launcher
        assert sum(pool.map(square, range(10))) == 285
    helper = mp.get_context("spawn").Process(target=square, args=(3,))
    helper.start()
    helper.join()
    dist.init_process_group("gloo")
    group = dist.distributed_c10d._get_process_group_name(dist.group.WORLD)
    issued: collections.Counter[tuple[str, str, str, int]] = collections.Counter()
    for step in range(args.steps):
        t = torch.ones(32)
        dist.all_reduce(t)
        issued[(group, "all_reduce", "float32", t.nbytes)] += 1
        if step == 0:
            with mp.get_context("fork").Pool(2) as pool:  # a rank's helpers
                pool.map(square, range(4))
    if args.counts:
        with open(f"{args.counts}.rank{dist.get_rank()}.json", "w") as f:
            json.dump([[*key, n] for key, n in sorted(issued.items())], f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
