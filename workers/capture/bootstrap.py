"""Run a user's script, unmodified, with commtop watching it.

    torchrun ... -m workers.capture.bootstrap train.py ARGS      # `commtop run -- python train.py ARGS`
    torchrun ... -m workers.capture.bootstrap -m package.mod ARGS

Before the script: ``TORCH_NCCL_ENABLE_TIMING=1`` (NCCL groups then time every collective on
their own stream, into the Flight Recorder), the ring's size when the user set none
(:func:`workers.capture.fr_source.choose_ring`), the monitor (connection, heartbeat, publisher),
a global optimizer step hook (steps), and a wrapper of ``init_process_group`` that picks the
capture once the backend is known: NCCL with a Flight Recorder -> :mod:`.cuda_capture`
(plus CUPTI copies when ``cupti-python`` loads); anything else -> :mod:`.fallback`, said in
one line. ``COMMTOP_CAPTURE=hooks`` forces the fallback, ``=off`` captures nothing; the ring is
decoded in a child process (:mod:`.fr_child`) unless ``COMMTOP_FR_DECODE=rank``.

Then the script runs through :mod:`runpy` as ``__main__`` with its own ``sys.argv``, so its
exit code, exceptions and signal handling are its own. One handler is added where SIGTERM is
at its default: on SIGTERM the rank sends what it timed, then ends by SIGTERM as it would have
(:mod:`.on_sigterm`); a handler the script installs replaces it. Its uncaught tracebacks are
printed without this bootstrap's, runpy's and the hooks' frames (:mod:`.own_frames`).
"""

from __future__ import annotations

import os
import runpy
import sys

from workers.capture import own_frames, spawned
from workers.capture.capture import CAPTURE_ENV, DECODE_ENV, Capture, cupti_holder

__all__ = ["CAPTURE_ENV", "DECODE_ENV", "Capture", "cupti_holder", "main", "split_target"]


def split_target(argv: list[str]) -> tuple[str, str, list[str]]:
    """("path"|"module", target, argv for the script) from the bootstrap's arguments. A
    ``--local-rank=N`` before the target (``torch.distributed.launch`` without ``--use-env`` puts
    it first: here, the bootstrap is its script) goes right after it, where launch puts it for a
    script run without commtop."""
    local_rank = [a for a in argv[:1] if a.startswith(("--local-rank=", "--local_rank="))]
    if local_rank:
        kind, target, script_argv = split_target(argv[1:])
        return kind, target, [script_argv[0], *local_rank, *script_argv[1:]]
    if not argv:
        raise SystemExit("usage: python -m workers.capture.bootstrap SCRIPT [ARGS] | -m MODULE [ARGS]")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("usage: python -m workers.capture.bootstrap -m MODULE [ARGS]")
        return "module", argv[1], [argv[1], *argv[2:]]
    return "path", argv[0], list(argv)


def main(argv: list[str] | None = None) -> None:
    kind, target, script_argv = split_target(list(sys.argv[1:] if argv is None else argv))
    if kind == "path" and not os.path.exists(target):
        raise SystemExit(f"commtop: cannot run {target!r}: no such file")
    sys.argv = script_argv  # the monitor names the run after the script
    capture = Capture()
    try:
        capture.install()
        if capture.mon is not None and capture.mon.on:
            spawned.install(capture.stand_aside, capture.env_set)  # a script that starts its own ranks
    except Exception as exc:  # noqa: BLE001 - the job runs even if commtop cannot watch it
        print(f"commtop: not watching this job ({type(exc).__name__}: {exc})", file=sys.stderr)
    own_frames.install()  # its tracebacks as the script alone prints them
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:  # never reaches sys.excepthook: the Bye says the script's own code
        if capture.mon is not None:
            capture.mon.failed_with(exc)
        raise


if __name__ == "__main__":
    main()
