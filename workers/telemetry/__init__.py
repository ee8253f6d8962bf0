"""commtop's node telemetry: one sampler process per node (``python -m workers.telemetry``).

Importing this package is cheap and torch-free: NVML, psutil and zmq are imported by the
sampler process itself, never by the worker that starts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONNECTION_FILE_ENV = "COMMTOP_CONNECTION_FILE"  # same name as workers.wire.connection (kept import-free)
#: Seconds between the sampler's ticks (its --interval; default 0.1): a slower sampler beside a job.
INTERVAL_ENV = "COMMTOP_TELEMETRY_INTERVAL"
LOG_NAME = "telemetry-{host}.log"


def start_node_sampler(
    connection_path: str, gpu_uuids: list[str], prometheus: str = ""
) -> subprocess.Popen[bytes] | None:
    """Spawn this node's sampler (call on local rank 0). Its stderr goes to a log in the run
    directory; the key travels in the connection file, never on the command line.
    Returns None (after one line on stderr) when it cannot start: the run goes on without it.
    With ``prometheus`` it also serves the node's metrics, in its own session so that it may
    outlive the job's process group for $COMMTOP_PROMETHEUS_LINGER_S (it still ends with its parent)."""
    import socket

    from workers.wire.lifeline import DIE_WITH_PARENT_ENV, env_for_child

    env = env_for_child(dict(os.environ), direct=True)  # it dies with this rank (PR_SET_PDEATHSIG)
    if prometheus:  # it serves a last scrape after this rank ends (its loop still sees the rank go)
        env.pop(DIE_WITH_PARENT_ENV, None)
    env[CONNECTION_FILE_ENV] = str(connection_path)
    argv = [sys.executable, "-m", "workers.telemetry", "--gpus", ",".join(u for u in gpu_uuids if u)]
    if prometheus:
        argv += ["--prometheus", prometheus]
    if os.environ.get(INTERVAL_ENV, "").strip():
        argv += ["--interval", os.environ[INTERVAL_ENV].strip()]
    root = Path(__file__).resolve().parent.parent.parent
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    log_path = Path(connection_path).parent / LOG_NAME.format(
        host=os.environ.get("COMMTOP_HOSTNAME") or socket.gethostname()
    )
    try:
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
    except OSError:
        log = None
    try:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log if log is not None else subprocess.DEVNULL,
            close_fds=True,
            start_new_session=bool(prometheus),
        )
    except OSError as exc:
        print(f"commtop: node telemetry sampler not started: {exc}", file=sys.stderr)
        return None
    finally:
        if log is not None:
            log.close()
