"""A job that counts its own collectives until it is stopped (for a stop's check, not commtop's).

    commtop run --headless --record R -- python counted_until_stopped.py FOLDER fast|slow|stuck

Each rank writes ``FOLDER/rankN.json``: ``begun`` before every collective call, ``done`` after it
returned. A stop may land between the two, so what a recording holds for a rank must lie in
[done, begun]. On a GPU it runs NCCL (all_reduce of 4 MiB and all_gather_into_tensor of 1 MiB per
rank, a loss read back every 100 iterations, as a training loop logs); on a CPU, gloo.

``stuck``: as ``fast``, but after 4 s the main thread gets stuck in a C call for 60 s, where a
Python signal handler cannot run: on a GPU a 60 s kernel ahead of the collectives and the next
read-back waiting for it (as a rank waits on a collective its stopped peer never issued); on a
CPU ``system("sleep 60")``. Collectives issued behind that kernel never finish before the stop.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    folder, pace = Path(sys.argv[1]), sys.argv[2]
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    out = folder / f"rank{rank}.json"
    counts = {"begun": 0, "done": 0}

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts))
        os.replace(tmp, out)

    grad = torch.ones(1 << 20, device=device)
    shard = torch.ones(1 << 18, device=device)
    gathered = torch.empty(world * shard.numel(), device=device)
    calls = [lambda: dist.all_reduce(grad), lambda: dist.all_gather_into_tensor(gathered, shard)]
    t0, i, stuck = time.monotonic(), 0, pace == "stuck"
    while time.monotonic() - t0 < 120:
        if stuck and time.monotonic() - t0 > 4:
            stuck = False
            if gpu:
                torch.cuda._sleep(int(1.2e11))  # cycles: 60 s at 2 GHz, longer at lower clocks
            else:
                ctypes.CDLL(None).system(b"sleep 60")
        for call in calls:
            counts["begun"] += 1
            save()
            call()
            counts["done"] += 1
            save()
        i += 1
        if i % 100 == 0:
            grad.sum().item()
        if pace == "slow":
            time.sleep(0.3)


if __name__ == "__main__":
    main()
