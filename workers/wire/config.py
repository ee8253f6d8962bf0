"""The worker loop's configuration and its command-line options.

Torch-free, so `commtop run` validates every option (and the memory it will need) before
any rank starts, and passes the same options on to `torchrun ... -m workers`.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields
from typing import Any

from workers.wire.protocol import COLLECTIVES, DIRECTIONS, MODES
from workers.wire.settings import COPY_SCALES, MAX_COPIES, Settings

DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
}
GPU_DEFAULT_SHAPE = (8192, 8192)
GPU_DEFAULT_DTYPE = "bfloat16"
CPU_DEFAULT_SHAPE = (1024, 1024)
CPU_DEFAULT_DTYPE = "float32"
MAX_ELEMENTS = 1 << 34


class ConfigError(ValueError):
    """An invalid option; the message is one line meant for the user."""


@dataclass(frozen=True)
class LoopConfig:
    """One worker loop: the forum's script with every knob exposed."""

    collective: str = "all_gather"
    shape: tuple[int, ...] = GPU_DEFAULT_SHAPE
    dtype: str = GPU_DEFAULT_DTYPE
    offload: str = "overlap"
    copies: int = 5
    copy_scale: float = 1.0
    pinned: bool = True
    direction: str = "d2h"
    collectives_per_step: int = 32
    iters: int = 0  # collectives per rank after warm-up; 0 = until stopped
    warmup: int = 5
    backend: str = "auto"  # auto | nccl | gloo
    batch_ms: float = 50.0  # publish a batch at least this often

    @property
    def tensor_bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BYTES[self.dtype]

    def initial_settings(self) -> Settings:
        return Settings(
            mode=self.offload,
            copies=self.copies,
            copy_scale=self.copy_scale,
            pinned=self.pinned,
            direction=self.direction,
        )

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        data["tensor_bytes"] = self.tensor_bytes
        return data

    def to_argv(self) -> list[str]:
        """The worker options that reproduce this config (for torchrun ... -m workers)."""
        return [
            "--collective",
            self.collective,
            "--shape",
            "x".join(map(str, self.shape)),
            "--dtype",
            self.dtype,
            "--offload",
            self.offload,
            "--copies",
            str(self.copies),
            "--copy-scale",
            str(self.copy_scale),
            "--host-memory",
            "pinned" if self.pinned else "pageable",
            "--direction",
            self.direction,
            "--collectives-per-step",
            str(self.collectives_per_step),
            "--iters",
            str(self.iters),
            "--warmup",
            str(self.warmup),
            "--backend",
            self.backend,
            "--batch-ms",
            str(self.batch_ms),
        ]

    def peak_host_bytes(self) -> int:
        """Host memory the loop allocates per rank (pinned + pageable copy buffers, CPU tensors)."""
        copy_buf = int(self.tensor_bytes * max(COPY_SCALES))
        return 2 * copy_buf

    def peak_device_bytes(self, world_size: int) -> int:
        """Device (or, on CPU, host) memory of the tensors of one rank, with headroom for the
        collective's output (all_gather: world_size tensors) and the copy source."""
        out = (
            self.tensor_bytes * world_size if self.collective in ("all_gather", "reduce_scatter") else self.tensor_bytes
        )
        return self.tensor_bytes + out + int(self.tensor_bytes * max(COPY_SCALES))


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(part) for part in text.lower().replace("*", "x").split("x"))
    except ValueError:
        raise ConfigError(f"--shape must look like 8192x8192; got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise ConfigError(f"--shape dimensions must be positive; got {text!r}")
    n = 1
    for d in dims:
        n *= d
    if n > MAX_ELEMENTS:
        raise ConfigError(f"--shape {text} has {n} elements; at most {MAX_ELEMENTS}")
    return dims


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `commtop run` and `-m workers` (defaults resolved per backend)."""
    g = parser.add_argument_group("workload (the forum loop)")
    g.add_argument("--collective", choices=COLLECTIVES, default="all_gather", help="the timed collective")
    g.add_argument(
        "--shape", default=None, help="per-rank tensor shape, e.g. 8192x8192 (GPU default; 1024x1024 on CPU)"
    )
    g.add_argument(
        "--dtype", choices=sorted(DTYPE_BYTES), default=None, help="bfloat16 on GPU, float32 on CPU by default"
    )
    g.add_argument("--offload", choices=MODES, default="overlap", help="how copies relate to collectives")
    g.add_argument("--copies", type=int, default=5, help=f"copies per step (0-{MAX_COPIES})")
    g.add_argument(
        "--copy-scale", type=float, default=1.0, help="copy size as a multiple of the tensor: 0.25, 0.5, 1, 2"
    )
    g.add_argument("--host-memory", choices=("pinned", "pageable"), default="pinned", help="host side of the copies")
    g.add_argument("--direction", choices=DIRECTIONS, default="d2h", help="copy direction: device to host or back")
    g.add_argument(
        "--collectives-per-step", type=int, default=32, help="collectives per step (the copies go once per step)"
    )
    g.add_argument("--iters", type=int, default=0, help="collectives per rank, then stop (0: until stopped)")
    g.add_argument("--warmup", type=int, default=5, help="iterations run first and not reported")
    g.add_argument(
        "--backend", choices=("auto", "nccl", "gloo"), default="auto", help="auto: nccl with a GPU, else gloo"
    )
    g.add_argument("--batch-ms", type=float, default=50.0, help=argparse.SUPPRESS)


#: Up to this many ranks every rank publishes at its own ``batch_ms``; beyond, batches are
#: spaced in proportion to the world size, so the viewer receives about as many messages a
#: second (~320 at 50 ms) at 64 or 512 ranks as at 16: its cost is per message more than per
#: record. At 64 ranks on the 2-core VM, halving the messages took the ingest thread from 24 % to
#: 16 % of a core (from 32 ranks on), and again from 12.6-14.3 % to 7.5-10.2 % (from 16 on;
#: the app 25.6-29.0 -> 18.0-22.4 %). The price: a record waits up to 200 ms in a 64-rank job's
#: rank (100 ms before), at most MAX_SCALED_BATCH_MS in a larger one's.
BATCH_SCALE_FROM_WORLD = 16
#: Widest batch spacing (well under the 2 s after which a silent rank is shown stale).
MAX_SCALED_BATCH_MS = 500.0


def seconds_in_range(text: str, lo: float, hi: float) -> float | None:
    """``text`` as seconds if it is a number in ``lo``-``hi``, else None (an environment
    variable's value: the callers keep their default and say so in one line)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if lo <= value <= hi else None


def batch_ms_for_world(batch_ms: float, world_size: int) -> float:
    """The batch spacing a rank of a ``world_size`` job uses: ``batch_ms`` up to
    BATCH_SCALE_FROM_WORLD ranks, then ``batch_ms * world / BATCH_SCALE_FROM_WORLD`` (at most
    MAX_SCALED_BATCH_MS, never less than ``batch_ms``). Records are never merged or dropped
    for it: every record still reaches the viewer, in fewer, larger batches."""
    if world_size <= BATCH_SCALE_FROM_WORLD:
        return batch_ms
    return max(batch_ms, min(MAX_SCALED_BATCH_MS, batch_ms * world_size / BATCH_SCALE_FROM_WORLD))


def config_from_args(ns: argparse.Namespace, cpu: bool) -> LoopConfig:
    """Validate parsed options into a LoopConfig; ``cpu`` picks the CPU-sized defaults."""
    shape = parse_shape(ns.shape) if ns.shape else (CPU_DEFAULT_SHAPE if cpu else GPU_DEFAULT_SHAPE)
    dtype = ns.dtype or (CPU_DEFAULT_DTYPE if cpu else GPU_DEFAULT_DTYPE)
    try:
        Settings().updated({"mode": ns.offload, "copies": ns.copies, "copy_scale": ns.copy_scale})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if ns.collectives_per_step < 1 or ns.collectives_per_step > 100000:
        raise ConfigError("--collectives-per-step must be in 1..100000")
    if ns.iters < 0 or ns.warmup < 0:
        raise ConfigError("--iters and --warmup must not be negative")
    if not 1.0 <= ns.batch_ms <= 10000:
        raise ConfigError("--batch-ms must be in 1..10000")
    return LoopConfig(
        collective=ns.collective,
        shape=shape,
        dtype=dtype,
        offload=ns.offload,
        copies=ns.copies,
        copy_scale=float(ns.copy_scale),
        pinned=ns.host_memory == "pinned",
        direction=ns.direction,
        collectives_per_step=ns.collectives_per_step,
        iters=ns.iters,
        warmup=ns.warmup,
        backend=ns.backend,
        batch_ms=ns.batch_ms,
    )


def config_from_dict(data: dict[str, Any]) -> LoopConfig:
    """Rebuild a config sent in a hello or stored in a recording (unknown keys ignored)."""
    names = {f.name for f in fields(LoopConfig)}
    values = {k: v for k, v in data.items() if k in names}
    if "shape" in values:
        values["shape"] = tuple(int(d) for d in values["shape"])
    return LoopConfig(**values)
