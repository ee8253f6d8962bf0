"""A job that counts its own collectives until it is stopped (for a stop's check, not commtop's).

    commtop run --headless --record R -- python counted_until_stopped.py FOLDER fast|slow

Each rank writes ``FOLDER/rankN.json``: ``begun`` before every collective call, ``done`` after it
returned. A stop may land between the two, so what a recording holds for a rank must lie in
[done, begun]. On a GPU it runs NCCL (all_reduce of 4 MiB and all_gather_into_tensor of 1 MiB per
rank, a loss read back every 100 iterations, as a training loop logs); on a CPU, gloo.
"""

from __future__ import annotations

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
    t0, i = time.monotonic(), 0
    while time.monotonic() - t0 < 120:
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
