"""A gloo job built on a device mesh, nothing of commtop in it: ``init_device_mesh`` makes the
default group itself (no backend named: torch calls it "undefined") through
torch.distributed.device_mesh's own binding of ``init_process_group``.

    commtop run --headless --record x.commtop -- python tests/jobs/device_mesh.py --counts /tmp/c

A (1, world) mesh: "dp" groups of one rank, a "tp" group of every rank. Per step an all_reduce on
each and an all_gather on "tp". The job counts what it issues, per (group name as torch names it,
op, dtype, nbytes as nccl-tests count them), into ``PREFIX.rankN.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--counts", default="", help="write this rank's counts to PREFIX.rankN.json")
    args = ap.parse_args(argv)
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    name = dist.distributed_c10d._get_process_group_name
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    issued: collections.Counter[tuple[str, str, str, int]] = collections.Counter()
    for _step in range(args.steps):
        t = torch.ones(256)
        dist.all_reduce(t, group=tp)
        issued[(name(tp), "all_reduce", "float32", t.nbytes)] += 1
        dist.all_reduce(t, group=dp)
        issued[(name(dp), "all_reduce", "float32", t.nbytes)] += 1
        gathered = torch.empty(256 * world)
        all_gather_single(gathered, t, group=tp)
        issued[(name(tp), "all_gather", "float32", gathered.nbytes)] += 1
    if args.counts:
        with open(f"{args.counts}.rank{dist.get_rank()}.json", "w") as f:
            json.dump([[*key, n] for key, n in sorted(issued.items())], f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
