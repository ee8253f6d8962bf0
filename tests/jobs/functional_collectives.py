"""A gloo job of functional collectives (DTensor's path), nothing of commtop in it.

    torchrun --standalone --nproc-per-node 2 tests/jobs/functional_collectives.py --steps 3 --counts /tmp/c
    commtop run --headless --record x.commtop -- python tests/jobs/functional_collectives.py --counts /tmp/c

Per step: ``torch.distributed._functional_collectives``' all_reduce (its result used only after
a blocking all_reduce that follows it), all_gather_single on dimension 0 and on dimension 1,
reduce_scatter_single, all_to_all_single and broadcast; then two DTensor redistributions, Shard(0)
to Replicate (an all_gather) and Partial to Replicate (an all_reduce), over a 1-D device mesh. The
job counts what it issues from its own logic, per (group name, op, dtype, nbytes as nccl-tests
count them), and writes the counts to ``PREFIX.rankN.json``
(tests/test_job_streams_recorded.py compares a recording with it).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--counts", default="", help="write this rank's counts to PREFIX.rankN.json")
    args = ap.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    group = dist.distributed_c10d._get_process_group_name(dist.group.WORLD)
    issued: collections.Counter[tuple[str, str, str, int]] = collections.Counter()

    def count(op: str, tensor: torch.Tensor, nbytes: int | None = None) -> None:
        dtype = str(tensor.dtype).removeprefix("torch.")
        issued[(group, op, dtype, tensor.nbytes if nbytes is None else nbytes)] += 1

    for step in range(args.steps):
        t = torch.full((64,), float(rank + step))
        pending = funcol.all_reduce(t, "sum", dist.group.WORLD)
        count("all_reduce", t)
        blocking = torch.ones(16)
        dist.all_reduce(blocking)
        count("all_reduce", blocking)
        total = float((pending + 0).sum())  # its first use: the wait
        assert total == 64 * sum(r + step for r in range(world)), total
        gathered = funcol.all_gather_single(t, 0, dist.group.WORLD)
        count("all_gather", t, t.nbytes * world)
        wide = torch.ones(4, 8)
        side = funcol.all_gather_single(wide, 1, dist.group.WORLD)
        count("all_gather", wide, wide.nbytes * world)
        big = torch.ones(8 * world)
        shard = funcol.reduce_scatter_single(big, "sum", 0, dist.group.WORLD)
        count("reduce_scatter", big)
        swapped = funcol.all_to_all_single(torch.ones(4 * world), None, None, dist.group.WORLD)
        count("all_to_all", torch.ones(4 * world))
        sent = funcol.broadcast(torch.ones(32, dtype=torch.bfloat16), 0, dist.group.WORLD)
        count("broadcast", torch.ones(32, dtype=torch.bfloat16))
        for result in (gathered, side, shard, swapped, sent):
            float(result.float().sum())
        local = torch.ones(4, 4)
        full = DTensor.from_local(local, mesh, [Shard(0)], run_check=False).redistribute(mesh, [Replicate()])
        count("all_gather", local, local.nbytes * world)
        summed = DTensor.from_local(local, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()])
        count("all_reduce", local)
        assert float(full.to_local().sum()) == 16 * world and float(summed.to_local().sum()) == 16 * world
    if args.counts:
        with open(f"{args.counts}.rank{rank}.json", "w") as f:
            json.dump([[*key, n] for key, n in sorted(issued.items())], f)
    if rank == 0:
        print(f"functional_collectives: {args.steps} steps, {sum(issued.values())} collectives per rank", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
