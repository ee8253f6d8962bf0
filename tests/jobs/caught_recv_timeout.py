"""A failure the job survives: rank 0 waits on an ``irecv`` of a side group with a timeout that
rank 1 never answers, catches gloo's timeout, and goes on with the world group's all_reduces.
Nothing of commtop in it.

    commtop run --headless -- python tests/jobs/caught_recv_timeout.py --counts PREFIX

Each rank writes how many collectives it issued, by its own logic, to ``PREFIX.rankN.json``
(rank 0: 3 all_reduces, the irecv whose wait failed, 3 more; rank 1: 6 all_reduces).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    side = dist.new_group([0, 1])  # gloo closes a pair whose op timed out: the world group's stay
    issued = 0
    for _ in range(3):
        dist.all_reduce(torch.ones(64))
        issued += 1
    if rank == 0:
        work = dist.irecv(torch.empty(64), 1, group=side)
        issued += 1
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.5))
        except RuntimeError as exc:
            print(f"rank 0: the irecv failed, going on: {str(exc).splitlines()[0][:80]}", flush=True)
    else:
        time.sleep(1.5)
    for _ in range(3):
        dist.all_reduce(torch.ones(64))
        issued += 1
    if args.counts:
        with open(f"{args.counts}.rank{rank}.json", "w") as fh:
            json.dump({"issued": issued}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
