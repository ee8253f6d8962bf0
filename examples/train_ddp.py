"""A small model trained with DDP, with an offload step, watched by commtop.

    commtop run -- python examples/train_ddp.py --steps 300          # TUI (torchrun on this node)
    commtop run --headless -- python examples/train_ddp.py           # summary table at the end
    commtop watch   # then, elsewhere: COMMTOP_CONNECTION_FILE=<printed file> torchrun --nproc-per-node 2 examples/train_ddp.py

Every step: an offload copy of a device buffer to host memory on a side stream (knob
``offload``: none / overlap = runs during the step's collectives / sync = finished before
them), then forward and backward of an MLP whose gradients DDP all-reduces through
``allreduce_hook`` (so ``dist.all_reduce`` is called, and timed), then an FSDP-style
all_gather of a parameter shard and an all_reduce of the loss. Flip the knob live from the
TUI (mode key) or with ``commtop ctl set knob.offload=overlap``. Runs on NCCL with GPUs and
on gloo/CPU without (small sizes there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from workers import monitor  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seconds", type=float, default=None, help="stop after this long instead (all ranks agree)")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--hidden", type=int, default=None, help="MLP width (default 4096 on GPU, 256 on CPU)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=None, help="per-rank batch (default 256 on GPU, 32 on CPU)")
    p.add_argument("--offload-mib", type=float, default=None, help="bytes offloaded per step (128 GPU, 4 CPU)")
    p.add_argument("--gather-mib", type=float, default=None, help="all_gather shard per rank (32 GPU, 1 CPU)")
    p.add_argument("--offload", choices=("none", "overlap", "sync"), default="overlap", help="initial knob value")
    p.add_argument("--until-knob", default=None, metavar="VALUE", help="stop 10 steps after offload becomes VALUE")
    return p.parse_args(argv)


def time_is_up(started: float, seconds: float, device: torch.device) -> bool:
    """Whether any rank's clock ran out: every rank stops at the same step."""
    flag = torch.tensor([float(time.perf_counter() - started > seconds)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


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
    batch = args.batch or (256 if cuda else 32)
    offload_mib = args.offload_mib if args.offload_mib is not None else (128.0 if cuda else 4.0)
    gather_mib = args.gather_mib if args.gather_mib is not None else (32.0 if cuda else 1.0)

    # --- commtop: three lines -------------------------------------------------------------
    mon = monitor.start()
    monitor.patch_distributed()
    mon.knob("offload", ["none", "overlap", "sync"], default=args.offload)

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    model = DistributedDataParallel(nn.Sequential(*layers).to(device), device_ids=[local_rank] if cuda else None)
    model.register_comm_hook(None, default_hooks.allreduce_hook)  # DDP's all-reduce through dist.all_reduce
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    gen = torch.Generator(device=device).manual_seed(rank)
    x = torch.randn(batch, hidden, device=device, generator=gen)
    y = torch.randn(batch, hidden, device=device, generator=gen)
    state = torch.ones(int(offload_mib * 2**20) // 4, device=device)  # what gets offloaded
    host = torch.empty(state.shape, dtype=state.dtype, pin_memory=cuda)
    shard = torch.ones(int(gather_mib * 2**20) // 4, device=device)
    gathered = torch.empty(shard.numel() * world, device=device)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    side = torch.cuda.Stream() if cuda else None
    copied = torch.cuda.Event() if cuda else None  # the previous offload copy (one in flight at most)

    stop_at = -1
    started = time.perf_counter()
    steps = args.steps if args.seconds is None else sys.maxsize
    for step in range(steps):
        with mon.step(step):
            mode = mon.setting("offload")
            if mode != "none":
                if side is not None and copied is not None:
                    copied.synchronize()  # the host buffer is free again (as a real offloader must wait)
                    side.wait_stream(torch.cuda.current_stream())
                with mon.copy("offload", stream=side, nbytes=state.nbytes):
                    host.copy_(state, non_blocking=cuda)
                if side is not None and copied is not None:
                    copied.record(side)
                    if mode == "sync":
                        copied.synchronize()  # finished before this step's collectives start
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            all_gather(gathered, shard)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
        if args.until_knob is not None and stop_at < 0 and mode == args.until_knob:
            stop_at = step + 10  # every rank switched at the same step, so they stop together
        if step == stop_at:
            break
        if args.seconds is not None and step % 10 == 9 and time_is_up(started, args.seconds, device):
            break
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"train_ddp: {step + 1} steps in {elapsed:.2f} s, loss {mean.item() / world:.4f}, offload {mode}")
    monitor.stop()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
