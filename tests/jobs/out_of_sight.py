"""A gloo job whose collectives are partly issued by torch underneath, nothing of commtop in it.

    torchrun --standalone --nproc-per-node 2 tests/jobs/out_of_sight.py --steps 3 --counts /tmp/c
    commtop run --headless --record x.commtop -- python tests/jobs/out_of_sight.py --counts /tmp/c

A plain DDP model (its constructor and first bucket rebuild issue collectives from C++) on the
world group and another on a second group; per step, both models' forward and backward, an
``all_reduce_coalesced``, a functional all_reduce whose backward issues one more, a list
``reduce_scatter`` and a ``monitored_barrier`` (gloo issues more than one op for each of these
last two on 2 ranks). What the job issued comes from torch.profiler in the same job (the
``c10d::`` ops the dispatcher ran, waits left out), independently of commtop, written with the
collectives the job's own logic knows go out of a Python wrapper's sight to ``PREFIX.rankN.json``
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--counts", default="", help="write this rank's counts to PREFIX.rankN.json")
    args = ap.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    second = dist.new_group(list(range(world)), group_desc="second")
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with prof:
        models = [
            torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8)),
            torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4), process_group=second),
        ]
        for _step in range(args.steps):
            for model in models:
                model(torch.randn(4, 8)).sum().backward()
            dist.all_reduce_coalesced([torch.ones(3), torch.ones(5)])
            x = torch.ones(16, requires_grad=True)
            funcol.all_reduce(x, "sum", dist.group.WORLD).sum().backward()
            dist.reduce_scatter(torch.empty(4), [torch.ones(4) for _ in range(world)])
            dist.monitored_barrier(group=second)
    ops = collections.Counter(e.name for e in prof.events() if e.name.startswith("c10d::"))
    issued = sum(n for name, n in ops.items() if "wait" not in name)
    if args.counts:
        with open(f"{args.counts}.rank{rank}.json", "w") as f:
            json.dump({"issued": issued, "out_of_sight_per_step": 2, "steps": args.steps}, f)
    if rank == 0:
        print(f"out_of_sight: {args.steps} steps, {issued} collectives per rank", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
