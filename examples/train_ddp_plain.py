"""A plain DDP training script with an offload step: nothing of commtop in it.

    commtop run -- python examples/train_ddp_plain.py --steps 300          # TUI, every rank
    commtop run --headless --record -- python examples/train_ddp_plain.py  # summary + recording
    torchrun --nproc-per-node 2 examples/train_ddp_plain.py                # without commtop

Per step: forward and backward of an MLP whose gradients DDP all-reduces in ``--layers``
buckets (``bucket_cap_mb`` is below one layer's weight, so each layer's weight and bias
are one bucket), an optimizer step, an offload of a state buffer to host memory (on GPU: a
pinned, non-blocking D2H copy on a side stream) and an all_reduce of the loss for logging.
So each rank issues ``steps * (layers + 1)`` all_reduces itself (DDP also runs a few set-up
collectives of its own at construction and after the first step).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=None, help="MLP width (default 4096 on GPU, 1024 on CPU)")
    p.add_argument("--batch", type=int, default=None, help="per-rank batch (default 256 on GPU, 16 on CPU)")
    p.add_argument("--offload-mib", type=float, default=None, help="bytes offloaded per step (128 GPU, 4 CPU)")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
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
    hidden = args.hidden or (4096 if cuda else 1024)
    batch = args.batch or (256 if cuda else 16)
    offload_mib = args.offload_mib if args.offload_mib is not None else (128.0 if cuda else 4.0)

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    weight_mb = hidden * hidden * 4 / 2**20
    model = DistributedDataParallel(
        nn.Sequential(*layers).to(device),
        device_ids=[local_rank] if cuda else None,
        bucket_cap_mb=weight_mb / 2,  # one bucket per layer (weight + bias)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(rank)
    x = torch.randn(batch, hidden, device=device, generator=gen)
    y = torch.randn(batch, hidden, device=device, generator=gen)
    state = torch.ones(int(offload_mib * 2**20) // 4, device=device)
    host = torch.empty(state.shape, dtype=state.dtype, pin_memory=cuda)
    side = torch.cuda.Stream() if cuda else None

    started = time.perf_counter()
    for _step in range(args.steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                host.copy_(state, non_blocking=True)  # the offload: D2H on a side stream
        else:
            host.copy_(state)
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if side is not None:
            side.synchronize()  # the host buffer is reused next step
    if cuda:
        torch.cuda.synchronize()
    if rank == 0:
        elapsed = time.perf_counter() - started
        print(f"train_ddp_plain: {args.steps} steps in {elapsed:.2f} s, loss {logged.item() / world:.4f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
