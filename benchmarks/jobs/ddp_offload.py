"""A user's DDP training job with offloads, nothing of commtop in it: the job commtop's cost
and completeness on "your own job" are measured with.

    torchrun --standalone --nproc-per-node 1 benchmarks/jobs/ddp_offload.py --steps 600
    commtop run --headless -- python benchmarks/jobs/ddp_offload.py --steps 600

Per step (defaults): forward and backward of an MLP of ``--layers`` Linear layers whose
gradients DDP all-reduces in one bucket per layer, ``--explicit`` collectives of the job's own
(a scalar loss all_reduce, a 1 KiB statistics all_reduce, an all_gather, a broadcast and a
reduce_scatter, on the world group or, with ``--groups 2``, some on a second group), and
three copies on a side stream (two device-to-host offloads and one host-to-device prefetch,
pinned). On an H200 that is ~10 collectives and 3 copies per ~4.5 ms step. ``--layers 0``
drops the model: a collectives-only job (e.g. ``--layers 0 --explicit 20`` for a job issuing
thousands of collectives a second); ``--rate R --seconds S`` paces the timed steps so the job
issues about R collectives/s for S seconds.

The job counts what it issues from its own logic and prints, on rank 0, one JSON line at the
end (``ddp_offload: {...}``): steps, the wall time of the timed steps, step time percentiles,
and ``issued``: its explicit collectives per (group, op, nbytes) plus DDP's bucket all-reduces
(``ddp_buckets`` per step, from DDP's own logging data), so a profiler's count can be checked
against the job's, not against itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

#: The job's own collectives, in issue order: (op, bytes of S per rank as nccl-tests counts it, group).
EXPLICIT = (
    ("all_reduce", 4, 0),  # the loss, for logging
    ("all_reduce", 1024, 1),  # gradient-norm statistics
    ("all_gather", 64 * 1024, 0),  # S = gathered size
    ("broadcast", 4096, 1),  # a schedule decision from rank 0
    ("reduce_scatter", 256 * 1024, 0),  # S = input size
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--layers", type=int, default=5, help="Linear layers = DDP buckets (0: no model)")
    p.add_argument("--hidden", type=int, default=None, help="MLP width (default 4096 on GPU, 256 on CPU)")
    p.add_argument("--batch", type=int, default=None, help="per-rank batch (default 256 on GPU, 16 on CPU)")
    p.add_argument("--explicit", type=int, default=5, help="the job's own collectives per step (cycling the list)")
    p.add_argument("--groups", type=int, choices=(1, 2), default=1, help="2: odd collectives on a second group")
    p.add_argument("--offload-mib", type=float, default=None, help="size of each copy (32 on GPU, 1 on CPU)")
    p.add_argument("--copies", type=int, default=3, help="copies per step: D2H, D2H, H2D, ... (GPU only)")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--rate", type=float, default=0.0, help="pace the timed steps to about this many collectives/s")
    p.add_argument("--seconds", type=float, default=0.0, help="with --rate: as many steps as fill this long")
    p.add_argument("--result", default="", help="also write the JSON line's object to this file")
    p.add_argument(
        "--step-log", default="", help="rank 0 writes each timed step's end (perf_counter s) and length here"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and args.backend != "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    hidden = args.hidden or (4096 if cuda else 256)
    batch = args.batch or (256 if cuda else 16)
    copy_mib = args.offload_mib if args.offload_mib is not None else (32.0 if cuda else 1.0)
    groups = [None, dist.new_group(list(range(world))) if args.groups == 2 else None]

    torch.manual_seed(0)
    model = None
    if args.layers:
        layers: list[nn.Module] = []
        for _ in range(args.layers):
            layers += [nn.Linear(hidden, hidden), nn.GELU()]
        weight_mb = hidden * hidden * 4 / 2**20
        model = DistributedDataParallel(
            nn.Sequential(*layers).to(device),
            device_ids=[local_rank] if cuda else None,
            bucket_cap_mb=weight_mb / 2,  # one bucket per layer (weight + bias)
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(rank)
    x = torch.randn(batch, hidden, device=device, generator=gen)
    y = torch.randn(batch, hidden, device=device, generator=gen)

    plan = [EXPLICIT[i % len(EXPLICIT)] for i in range(args.explicit)]
    per_step = args.explicit + args.layers  # collectives a step issues (one DDP bucket per layer)
    period = per_step / args.rate if args.rate > 0 else 0.0
    if period and args.seconds:
        args.steps = max(1, int(args.seconds / period))
    buffers = []
    for op, nbytes, _g in plan:
        per_rank = max(1, nbytes // 4)
        if op == "all_gather":
            buffers.append((torch.ones(per_rank, device=device), torch.empty(per_rank * world, device=device)))
        elif op == "reduce_scatter":
            total = max(world, per_rank - per_rank % world)
            buffers.append((torch.ones(total, device=device), torch.empty(total // world, device=device)))
        else:
            buffers.append((torch.ones(per_rank, device=device), None))

    n_copy = int(copy_mib * 2**20) // 4
    copies = []
    side = torch.cuda.Stream() if cuda else None
    if cuda:
        for i in range(args.copies):
            dev = torch.ones(n_copy, device=device)
            host = torch.empty(n_copy, pin_memory=True)
            copies.append((dev, host) if i % 3 != 2 else (host, dev))  # D2H, D2H, H2D

    issued: Counter[tuple[int, str, int]] = Counter()
    # torch >= 2.13 names them *_single (the old names warn); torch 2.11 has only the old ones.
    all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def step() -> None:
        if model is not None:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for (op, _nbytes, g), (a, b) in zip(plan, buffers, strict=True):
            group = groups[g] if args.groups == 2 else None
            if op == "all_reduce":
                dist.all_reduce(a, group=group)
                s = a.nbytes
            elif op == "all_gather":
                all_gather_single(b, a, group=group)
                s = b.nbytes
            elif op == "broadcast":
                dist.broadcast(a, src=0, group=group)
                s = a.nbytes
            else:
                reduce_scatter_single(b, a, group=group)
                s = a.nbytes
            issued[(g if args.groups == 2 else 0, op, s)] += 1
        if side is not None and copies:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for dst_src in copies:
                    dst_src[1].copy_(dst_src[0], non_blocking=True)
            torch.cuda.current_stream().wait_stream(side)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    times: list[float] = []
    ends: list[float] = []
    started = time.perf_counter()
    last = started
    next_at = started
    for _ in range(args.steps):
        if period:  # paced: start each step on its schedule (a step that runs late starts at once)
            next_at += period
            while (left := next_at - time.perf_counter()) > 0:
                time.sleep(left if left > 2e-4 else 0)
        step()
        if cuda:
            torch.cuda.current_stream().synchronize()  # step time as the job sees it
        now = time.perf_counter()
        times.append(now - last)
        ends.append(now)
        last = now
    elapsed = time.perf_counter() - started
    buckets = 0
    if model is not None:
        data = model._get_ddp_logging_data()
        buckets = int(data.get("num_buckets_reduced", 0)) if isinstance(data, dict) else 0
    if rank == 0 and args.step_log:
        with open(args.step_log, "w") as f:
            json.dump(
                {"end_s": ends, "dur_s": times, "perf_to_epoch_ns": time.time_ns() - int(time.perf_counter() * 1e9)}, f
            )
    if rank == 0:
        times.sort()
        out = {
            "steps": args.steps,
            "warmup": args.warmup,
            "world": world,
            "backend": "nccl" if cuda else "gloo",
            "elapsed_s": round(elapsed, 6),
            "step_ms_mean": round(elapsed / args.steps * 1e3, 4),
            "step_ms_p50": round(times[len(times) // 2] * 1e3, 4),
            "step_ms_p99": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3, 4),
            "ddp_buckets": buckets,
            "issued": [[g, op, s, n] for (g, op, s), n in sorted(issued.items())],
            "issued_total": sum(issued.values()) + buckets * (args.steps + args.warmup),
            "rate_per_s": round((args.explicit + buckets) * args.steps / elapsed, 1),  # timed steps
        }
        print("ddp_offload: " + json.dumps(out), flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(out, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
