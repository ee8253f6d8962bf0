"""A gloo pipeline's hand-offs with non-blocking point-to-point, nothing of commtop in it.

    torchrun --standalone --nproc-per-node 2 tests/jobs/pipeline_p2p.py --steps 5 --counts /tmp/c
    commtop run --headless --record x.commtop -- python tests/jobs/pipeline_p2p.py --counts /tmp/c

Per step, around a ring of ranks: ``isend`` of the activations to the next rank and ``irecv``
from the previous one, both waited at once; an all_reduce issued while a second ``irecv`` is
still in flight, that ``irecv`` waited only afterwards; a ``batch_isend_irecv`` of a send and a
recv (two sizes: 4 KiB and 64 KiB of float32), its Works waited in turn; an ``irecv`` from any
source; an all_reduce with ``async_op=True``. The job counts what it issues from its own logic, per (group name, op,
dtype, nbytes), an isend as a ``send`` and an irecv as a ``recv``, and writes the counts to
``PREFIX.rankN.json`` (tests/test_job_streams_recorded.py compares a recording with it).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch
import torch.distributed as dist


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--counts", default="", help="write this rank's counts to PREFIX.rankN.json")
    args = ap.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    group = dist.distributed_c10d._get_process_group_name(dist.group.WORLD)
    issued: collections.Counter[tuple[str, str, str, int]] = collections.Counter()

    def count(op: str, tensor: torch.Tensor) -> None:
        issued[(group, op, str(tensor.dtype).removeprefix("torch."), tensor.nbytes)] += 1

    for step in range(args.steps):
        out, into = torch.full((1024,), float(step)), torch.empty(1024)
        works = [dist.isend(out, nxt), dist.irecv(into, prev)]
        count("send", out)
        count("recv", into)
        for w in works:
            w.wait()
        late = torch.empty(1024)
        pending = dist.irecv(late, prev)
        count("recv", late)
        grads = torch.ones(256)
        dist.all_reduce(grads)
        count("all_reduce", grads)
        dist.isend(out, nxt).wait()
        count("send", out)
        pending.wait()
        for n in (1024, 16384):
            a, b = torch.ones(n), torch.empty(n)
            ops = [dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, b, prev)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            count("send", a)
            count("recv", b)
        anyone = torch.empty(1024)
        works = [dist.isend(out, nxt), dist.irecv(anyone)]  # from any source: gloo's recv_anysource
        count("send", out)
        count("recv", anyone)
        for w in works:
            w.wait()
        handle = dist.all_reduce(grads, async_op=True)
        count("all_reduce", grads)
        assert handle is not None
        handle.wait()
    if args.counts:
        with open(f"{args.counts}.rank{rank}.json", "w") as f:
            json.dump([[*key, n] for key, n in sorted(issued.items())], f)
    if rank == 0:
        print(f"pipeline_p2p: {args.steps} steps, {sum(issued.values())} ops per rank", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
