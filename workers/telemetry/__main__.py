"""``python -m workers.telemetry --gpus UUID,UUID``: the node sampler process.

The connection file comes from $COMMTOP_CONNECTION_FILE (never the key on a command line).
Exits when its parent (the local-rank-0 worker) dies, or on SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from workers.wire.connection import CONNECTION_FILE_ENV, ConnectionError_, load
from workers.wire.lifeline import arm_from_env


def main(argv: list[str] | None = None) -> int:
    arm_from_env()  # its rank asked: end with it (the loop also watches the parent pid)
    parser = argparse.ArgumentParser(prog="python -m workers.telemetry", description=__doc__)
    parser.add_argument("--gpus", default="", help="comma-separated GPU UUIDs (default: every NVML device)")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between ticks (default 0.1)")
    parser.add_argument("--prometheus", default="", metavar="[HOST:]PORT", help="serve this node's metrics there")
    args = parser.parse_args(argv)
    if not 0.02 <= args.interval <= 10:
        print("commtop telemetry: --interval must be between 0.02 and 10 seconds", file=sys.stderr)
        return 2
    path = os.environ.get(CONNECTION_FILE_ENV)
    if not path:
        print(f"commtop telemetry: ${CONNECTION_FILE_ENV} is not set", file=sys.stderr)
        return 2
    try:
        conn = load(path)
    except ConnectionError_ as exc:
        print(f"commtop telemetry: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from workers.telemetry.sampler import run

    uuids = [u.strip() for u in args.gpus.split(",") if u.strip()]
    return run(conn, uuids, args.interval, args.prometheus)


if __name__ == "__main__":
    sys.exit(main())
