"""A torchrun job whose ranks end with ``os._exit`` (no atexit, no finalisation: frameworks end
that way to skip a slow teardown), or with ``sys.exit`` (``--by sys.exit``: the code;
``--by message``: a message, status 1), nothing of commtop in it.

    commtop run --headless --nproc 2 --record x.commtop -- python tests/jobs/ends_by_os_exit.py --code 3 --counts /tmp/c

Each rank all_reduces a float32 tensor of 8 elements ``--steps`` times (no destroy_process_group:
os._exit right after), counts them into ``PREFIX.rankN.json``, then calls ``os._exit(CODE)``;
before that, a forked helper of the rank leaves by ``os._exit`` too (as multiprocessing's do).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys

import torch
import torch.distributed as dist


def helper() -> None:
    """A forked helper: multiprocessing ends it with os._exit."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=37)
    ap.add_argument("--code", type=int, default=0)
    ap.add_argument("--counts", default="")
    ap.add_argument("--by", choices=("os._exit", "sys.exit", "message"), default="os._exit")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    group = dist.distributed_c10d._get_process_group_name(dist.group.WORLD)
    t = torch.ones(8)
    for step in range(args.steps):
        dist.all_reduce(t)
        if step == 0:
            child = mp.get_context("fork").Process(target=helper)
            child.start()
            child.join()
    if args.counts:
        with open(f"{args.counts}.rank{dist.get_rank()}.json", "w") as f:
            json.dump([[group, "all_reduce", "float32", t.nbytes, args.steps]], f)
    if args.by == "sys.exit":
        sys.exit(args.code)
    if args.by == "message":
        sys.exit(f"rank {dist.get_rank()}: stopping here")
    os._exit(args.code)


if __name__ == "__main__":
    main()
