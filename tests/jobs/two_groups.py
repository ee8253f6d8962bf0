"""A gloo job with two process groups, ten ops, three sizes and two dtypes, nothing of commtop in it.

    torchrun --standalone --nproc-per-node 2 tests/jobs/two_groups.py --steps 5 --counts /tmp/c
    commtop run --headless --record x.commtop -- python tests/jobs/two_groups.py --counts /tmp/c

Per step, for each of three message sizes: an all_reduce on the world group (float32) and one on
a second group (bfloat16), an all_gather_single and a broadcast on the second group, a
reduce_scatter_single and an all_to_all_single on the world group; then a gather to rank 0 on
the world group and a scatter from rank 0 on the second (4 KiB a rank), a pipeline's send to
the next rank and recv from the previous one (4 KiB), and a barrier. The job counts
what it issues from its own logic, per (group name as torch names it, op, dtype, nbytes as
nccl-tests count them: the gathered output for all_gather, a rank's tensor times the group's
size for gather and scatter, the input otherwise), and writes the
counts to ``PREFIX.rankN.json`` (tests/test_job_streams_recorded.py compares a recording with it).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch
import torch.distributed as dist

SIZES = (64, 1024, 16384)  # elements: 256 B, 4 KiB and 64 KiB of float32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--counts", default="", help="write this rank's counts to PREFIX.rankN.json")
    args = ap.parse_args(argv)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    pair = dist.new_group(list(range(world)), group_desc="pair")
    name = dist.distributed_c10d._get_process_group_name
    groups = {None: name(dist.group.WORLD), pair: name(pair)}
    all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    issued: collections.Counter[tuple[str, str, str, int]] = collections.Counter()

    def count(group: dist.ProcessGroup | None, op: str, tensor: torch.Tensor) -> None:
        issued[(groups[group], op, str(tensor.dtype).removeprefix("torch."), tensor.nbytes)] += 1

    for _step in range(args.steps):
        for n in SIZES:
            t = torch.ones(n)
            dist.all_reduce(t)
            count(None, "all_reduce", t)
            h = torch.ones(n, dtype=torch.bfloat16)
            dist.all_reduce(h, group=pair)
            count(pair, "all_reduce", h)
            gathered = torch.empty(n * world)
            all_gather_single(gathered, t, group=pair)
            count(pair, "all_gather", gathered)
            dist.broadcast(t, src=0, group=pair)
            count(pair, "broadcast", t)
            scattered = torch.empty(n // world)
            reduce_scatter_single(scattered, t)
            count(None, "reduce_scatter", t)
            exchanged = torch.empty(n)
            dist.all_to_all_single(exchanged, t)
            count(None, "all_to_all", t)
        rank = dist.get_rank()
        shard = torch.ones(SIZES[1])
        dist.gather(shard, [torch.empty_like(shard) for _ in range(world)] if rank == 0 else None, dst=0)
        issued[(groups[None], "gather", "float32", shard.nbytes * world)] += 1
        received = torch.empty(SIZES[1])
        pieces = [torch.ones(SIZES[1]) for _ in range(dist.get_world_size(pair))] if rank == 0 else None
        dist.scatter(received, pieces, src=0, group=pair)
        issued[(groups[pair], "scatter", "float32", received.nbytes * dist.get_world_size(pair))] += 1
        # a pipeline's hand-off: each rank sends its activations to the next, which receives them
        activations = torch.ones(SIZES[1])
        if rank + 1 < world:
            dist.send(activations, dst=rank + 1)
            count(None, "send", activations)
        if rank > 0:
            dist.recv(activations, src=rank - 1)
            count(None, "recv", activations)
        dist.barrier()
        issued[(groups[None], "barrier", "?", 0)] += 1
    if args.counts:
        with open(f"{args.counts}.rank{dist.get_rank()}.json", "w") as f:
            json.dump([[*key, n] for key, n in sorted(issued.items())], f)
    if dist.get_rank() == 0:
        print(f"two_groups: {args.steps} steps, {sum(issued.values())} collectives per rank", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
