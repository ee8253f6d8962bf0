"""A gloo job that issues collectives from two threads at once, nothing of commtop in it: the
training loop on the main thread, and a background thread on a group of its own (what an
asynchronous checkpoint's saver does: torch.distributed.checkpoint's async_save runs its
collectives off the training thread).

    commtop run --headless --nproc 2 --record x.commtop -- python tests/jobs/threaded_collectives.py --counts /tmp/c

Per step the main thread all_reduces 1024 float32 on the world group; the side thread, started
before the loop, all_reduces 256 float32 and all_gathers 64 int64 on its own group as fast as it
can until the loop ends. Each thread counts what it issues per (group name, op, dtype, nbytes);
the rank writes the sum to ``PREFIX.rankN.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading

import torch
import torch.distributed as dist

Key = tuple[str, str, str, int]


def side(group: dist.ProcessGroup, name: str, stop: threading.Event, issued: collections.Counter[Key]) -> None:
    """The background thread: collectives on its own group until told to stop (both ranks agree
    on when through the group itself: the stop flag is all_reduced)."""
    world = dist.get_world_size(group)
    while True:
        flag = torch.tensor([1 if stop.is_set() else 0])
        dist.all_reduce(flag, group=group)
        issued[(name, "all_reduce", "int64", flag.nbytes)] += 1
        if flag.item():
            return
        t = torch.ones(256)
        dist.all_reduce(t, group=group)
        issued[(name, "all_reduce", "float32", t.nbytes)] += 1
        out = torch.empty(64 * world, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.ones(64, dtype=torch.int64), group=group)
        issued[(name, "all_gather", "int64", out.nbytes)] += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--counts", default="")
    args = ap.parse_args(argv)
    dist.init_process_group("gloo")
    name = dist.distributed_c10d._get_process_group_name
    saver = dist.new_group(list(range(dist.get_world_size())), group_desc="saver")
    side_issued: collections.Counter[Key] = collections.Counter()
    stop = threading.Event()
    thread = threading.Thread(target=side, args=(saver, name(saver), stop, side_issued), name="saver")
    thread.start()
    issued: collections.Counter[Key] = collections.Counter()
    world = name(dist.group.WORLD)
    for _step in range(args.steps):
        t = torch.ones(1024)
        dist.all_reduce(t)
        issued[(world, "all_reduce", "float32", t.nbytes)] += 1
    stop.set()
    thread.join()
    issued.update(side_issued)
    if args.counts:
        with open(f"{args.counts}.rank{dist.get_rank()}.json", "w") as f:
            json.dump([[*key, n] for key, n in sorted(issued.items())], f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
