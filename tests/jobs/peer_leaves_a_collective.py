"""A hang that ends: rank 1 skips its 5th all_reduce, sleeps SECONDS in its own code and leaves;
rank 0 waits inside that all_reduce until gloo says the peer is gone, then ends. Nothing of
commtop in it.

    commtop run --headless -- python tests/jobs/peer_leaves_a_collective.py --seconds 4 --counts PREFIX [--wait]

``--wait``: rank 0's fifth is ``all_reduce(async_op=True)`` and it waits in ``Work.wait()`` (as DDP
and FSDP wait on theirs). ``--p2p``: rank 0 then sends to rank 1 with ``isend`` and never waits on it (a
fire-and-forget send), and waits on an ``irecv`` rank 1 never answers: torch issued both, neither
ends (2 lost).

Each rank writes what it issued, by its own logic, to ``PREFIX.rankN.json`` (rows [group, op,
dtype, nbytes, count]; rank 0's fifth all_reduce failed after torch issued it).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--counts", default="")
    ap.add_argument("--wait", action="store_true", help="rank 0: an async all_reduce, then wait()")
    ap.add_argument("--p2p", action="store_true", help="rank 0: an isend never waited on, an irecv that fails")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    name = dist.distributed_c10d._get_process_group_name(dist.group.WORLD)
    for _ in range(4):
        dist.all_reduce(torch.ones(64))
    rows = [[name, "all_reduce", "float32", 256, 4]]
    if args.counts:
        with open(f"{args.counts}.rank{rank}.json", "w") as fh:
            json.dump(rows, fh)
    if rank == 1:
        time.sleep(args.seconds)  # its own code: no collective
        os._exit(0)
    try:
        if args.p2p:
            unwaited = dist.isend(torch.ones(64), 1)  # noqa: F841 - kept, never waited on
            dist.irecv(torch.empty(64), 1).wait()  # fails once rank 1 is gone
        elif args.wait:
            dist.all_reduce(torch.ones(64), async_op=True).wait()  # never joined: fails once rank 1 is gone
        else:
            dist.all_reduce(torch.ones(64))
    except RuntimeError as exc:
        print(f"rank 0: the fifth {'irecv' if args.p2p else 'all_reduce'} failed: {exc}".splitlines()[0], flush=True)


if __name__ == "__main__":
    main()
