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

Then the script runs as python runs it (:func:`run_script`: ``__main__``, its own ``sys.argv``,
an absolute ``__file__``), so its exit code, exceptions and signal handling are its own;
commtop's warnings keep their own plain stderr line whatever the job does with logging
(:func:`own_log`). One handler is added where SIGTERM is
at its default: on SIGTERM the rank sends what it timed, then ends by SIGTERM as it would have
(:mod:`.on_sigterm`); a handler the script installs replaces it. Its uncaught tracebacks are
printed without this bootstrap's, runpy's and the hooks' frames (:mod:`.own_frames`).
"""

from __future__ import annotations

import builtins
import logging
import os
import runpy
import sys
import types
import zipfile
from typing import Any

from workers.capture import own_frames, spawned
from workers.capture.capture import CAPTURE_ENV, DECODE_ENV, Capture, cupti_holder
from workers.capture.whole_lines import whole_lines

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


class _StderrOfTheMoment(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes (a job may replace it), as logging's
    last-resort handler does."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def own_log() -> None:
    """commtop's warnings (``commtop.*`` loggers) go to stderr as one plain line each, whatever
    the job does with logging: through a job's ``basicConfig`` they took its format (a failed
    rank's "its error" then quoted commtop's warning, date first), and a job's level of ERROR
    hid them."""
    logger = logging.getLogger("commtop")
    if not any(isinstance(h, _StderrOfTheMoment) for h in logger.handlers):
        handler = _StderrOfTheMoment()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def run_script(target: str) -> None:
    """Run a script file as python's command line does: as ``__main__``, its ``__file__`` (and
    code's file name) absolute, ``sys.argv[0]`` as typed. ``runpy.run_path`` gives the path it is
    handed to both: a relative one made ``__file__`` relative (a script that changes directory,
    then opens a file beside itself, failed), an absolute one changes ``sys.argv[0]``. A
    directory or zip file with a ``__main__.py`` runs through runpy."""
    path = os.path.abspath(target)
    sys.path[0] = os.path.dirname(path)
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        runpy.run_path(target, run_name="__main__")
        return
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins)
    sys.modules["__main__"] = main_module  # pickle, multiprocessing's spawn and the script find it
    exec(code, main_module.__dict__)


def main(argv: list[str] | None = None) -> None:
    kind, target, script_argv = split_target(list(sys.argv[1:] if argv is None else argv))
    if kind == "path" and not os.path.exists(target):
        raise SystemExit(f"commtop: cannot run {target!r}: no such file")
    sys.argv = script_argv  # the monitor names the run after the script
    whole_lines()
    own_log()
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
            run_script(target)
    except SystemExit as exc:  # never reaches sys.excepthook: the Bye says the script's own code
        if capture.mon is not None:
            capture.mon.failed_with(exc)
        raise


if __name__ == "__main__":
    main()
