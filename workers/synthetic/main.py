"""``torchrun --nproc-per-node N -m workers [loop options] [--connection-file F | --connect EP]``

One rank of commtop's instrumented collective + offload loop. The connection is resolved
before torch is imported, so a bad option fails in milliseconds with one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
from typing import Any

from workers.rank.control import Control, StaticControl, live_control_off
from workers.wire import exporter_address
from workers.wire.config import ConfigError, LoopConfig, add_loop_arguments, config_from_args
from workers.wire.connection import CONNECTION_FILE_ENV, Connection, ConnectionError_, find_by_endpoint, load
from workers.wire.lifeline import arm_from_env

PROG = "commtop worker"


class UsageError(Exception):
    """A one-line problem with how the worker was started (exit 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__.splitlines()[0])
    add_loop_arguments(parser)
    g = parser.add_argument_group("where to send timings")
    g.add_argument("--connection-file", help=f"the run's connection file (else ${CONNECTION_FILE_ENV})")
    g.add_argument("--connect", metavar="ENDPOINT", help="the collector's data endpoint, e.g. tcp://head:5555")
    g.add_argument(
        "--prometheus",
        metavar="[HOST:]PORT",
        default=None,
        help="serve this node's metrics to Prometheus (local rank 0's sampler; 127.0.0.1 unless HOST; 0 = any port)",
    )
    parser.add_argument(
        "--bare", action="store_true", help="the same loop with commtop's instrumentation off (overhead A/B)"
    )
    return parser


def connection_from_args(ns: argparse.Namespace) -> Connection | None:
    """--connection-file, else $COMMTOP_CONNECTION_FILE, else the file of this user whose
    data endpoint is --connect; None when nothing names a collector."""
    if ns.connect:
        check_endpoint(ns.connect)
    path = ns.connection_file or os.environ.get(CONNECTION_FILE_ENV)
    if path:
        try:
            conn = load(path)
        except ConnectionError_ as exc:
            raise UsageError(str(exc)) from None
        # control/request move to the --connect host too (a file written for --listen 0.0.0.0 names 0.0.0.0)
        return conn.for_connect(ns.connect) if ns.connect else conn
    if ns.connect:
        try:
            found = find_by_endpoint(ns.connect)
        except ConnectionError_ as exc:
            raise UsageError(str(exc)) from None
        if found is None:
            raise UsageError(
                f"no key for {ns.connect} on this host: copy the run's connection file from the head node "
                f"and pass --connection-file FILE (or set {CONNECTION_FILE_ENV})"
            )
        return found
    return None


def check_endpoint(endpoint: str) -> None:
    """A one-line error before torch is imported for an endpoint ZeroMQ cannot use (it would
    raise deep in the loop), or a host name that does not resolve (it would fail silently)."""
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return
    host, _, port = endpoint[len("tcp://") :].rpartition(":") if endpoint.startswith("tcp://") else ("", "", "")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--connect must look like tcp://HOST:PORT (or ipc://PATH); got {endpoint!r}")
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(f"--connect {endpoint}: cannot resolve host {host!r} ({exc.strerror or exc})") from None


def make_control(config: LoopConfig, conn: Connection | None, rank: int) -> Control:
    """The settings source of the loop: live (changed by the TUI / `commtop ctl`, switched on
    every rank at the same iteration via torchrun's store) when a collector is named, else fixed."""
    if conn is None or live_control_off():  # fixed settings (an A/B of what live control costs)
        return StaticControl(config.initial_settings())
    from workers.rank.live_control import make_live_control

    return make_live_control(
        conn,
        config.initial_settings(),
        rank=rank,
        world_size=_env_int("WORLD_SIZE", 1),
        step=config.collectives_per_step,
    )


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else default
    except ValueError:
        raise UsageError(f"${name} must be an integer; got {value!r}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_from_args(ns: argparse.Namespace, conn: Connection | None, local_rank: int) -> str:
    """--prometheus, else the run's connection file's setting; "" when off. Needs a connection:
    its key signs what the ranks push to their node's exporter."""
    address = ns.prometheus if ns.prometheus is not None else (conn.prometheus if conn is not None else "")
    if not address:
        return ""
    try:
        host, _ = exporter_address.parse(address)
    except exporter_address.AddressError as exc:
        raise UsageError(str(exc)) from None
    if conn is None:
        raise UsageError("--prometheus needs the run's connection file (its key signs the ranks' records)")
    if local_rank == 0 and exporter_address.is_wide(host):
        print(f"{PROG}: {exporter_address.warning(address)}", file=sys.stderr)
    return address


def main(argv: list[str] | None = None) -> int:
    arm_from_env()  # `commtop run` asked: end with the torchrun agent, even if it is SIGKILLed
    ns = build_parser().parse_args(argv)
    try:
        conn = connection_from_args(ns)
        rank = _env_int("RANK", 0)
        world_size = _env_int("WORLD_SIZE", 1)
        local_rank = _env_int("LOCAL_RANK", 0)
        local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        prometheus = "" if ns.bare else prometheus_from_args(ns, conn, local_rank)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if conn is None and rank == 0:
        print(f"{PROG}: no connection file or --connect given; running without publishing", file=sys.stderr)

    import torch  # after the cheap checks: importing torch takes seconds
    import torch.distributed as dist

    from workers.rank.device import gpu_uuid
    from workers.rank.heartbeat import StopFlag
    from workers.synthetic.loop import Runtime, run_worker

    cuda = torch.cuda.is_available()
    backend = ns.backend if ns.backend != "auto" else ("nccl" if cuda else "gloo")
    try:
        if backend == "nccl" and not cuda:
            raise UsageError("--backend nccl needs a CUDA GPU; none is visible (use --backend gloo)")
        config = config_from_args(ns, cpu=backend == "gloo")
        if backend == "nccl" and local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible")
    except (UsageError, ConfigError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    rt = Runtime(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        cuda=backend == "nccl",
        backend="nccl" if backend == "nccl" else "gloo/cpu",
        device_index=local_rank if backend == "nccl" else -1,
    )

    stop = StopFlag()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.request(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if "MASTER_ADDR" not in os.environ:  # plain `python -m workers`: a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    if rt.cuda:
        torch.cuda.set_device(rt.device_index)
        try:
            dist.init_process_group("nccl", device_id=torch.device("cuda", rt.device_index))
        except TypeError:  # torch without eager init
            dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")

    # the node sampler (started by local rank 0's session) watches this node's GPUs
    uuids = [gpu_uuid(i) for i in range(min(local_world_size, torch.cuda.device_count()))] if rt.cuda else []
    try:
        control = make_control(config, None if ns.bare else conn, rank)
    except Exception as exc:
        print(f"{PROG} rank {rank}: live control not started ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    try:
        result = run_worker(
            config,
            rt,
            conn,
            control,
            bare=ns.bare,
            stop=stop,
            dead_man=True,
            sampler_gpus=uuids,
            prometheus=prometheus,
        )
    finally:
        control.close()
    # NCCL's teardown can hang when a peer died mid-collective: bound it.
    guard = threading.Timer(3.0, os._exit, args=(result.exit_code,))
    guard.daemon = True
    guard.start()
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    guard.cancel()
    # One write of the whole line: ranks share torchrun's stdout, and print() writes the text and
    # the newline separately, so two ranks' summaries could interleave on one line.
    sys.stdout.write("commtop-summary " + json.dumps(result.summary) + "\n")
    sys.stdout.flush()
    if result.exit_code:
        print(f"{PROG} rank {rank}: {result.reason}", file=sys.stderr)
    return result.exit_code
