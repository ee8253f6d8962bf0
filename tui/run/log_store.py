"""Where a job's output is kept: never in the run's folder (that goes when the run ends).

A job this process starts writes, through torchrun, into a scratch folder (``<run id>.parts``:
torchrun's own output and its ``--log-dir`` with one stdout and one stderr file per rank);
:mod:`tui.run.job_output` follows those files and writes the job's log, one file with a rank
prefix on every line, the way ``torchrun --tee`` prints it. The log goes beside the recording
when the run records (``recordings/NAME.log`` for ``recordings/NAME.commtop``), else under
``$XDG_STATE_HOME/commtop/logs`` (``~/.local/state/commtop/logs``), where only the newest
:data:`KEEP_LOGS` are kept. The scratch folder is removed once its run ended and was read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Job logs kept in the state folder (a log beside a recording is the user's and is never pruned).
KEEP_LOGS = 20
PARTS_SUFFIX = ".parts"


def logs_root() -> Path:
    """``$XDG_STATE_HOME/commtop/logs``, or ``~/.local/state/commtop/logs`` (created 0700); a
    home that cannot be written (a read-only container) falls back to ``/tmp/commtop-logs-UID``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    root = Path(state) / "commtop" / "logs"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        root = Path(tempfile.gettempdir()) / f"commtop-logs-{os.getuid()}"
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


@dataclass(frozen=True)
class JobLogPaths:
    """The files of one job's output."""

    #: the job's log: every rank's lines with their prefix, and torchrun's own (kept)
    log: Path
    #: scratch: torchrun's own stdout and stderr, and its per-rank files (``ranks/``)
    parts: Path

    @property
    def torchrun_stdout(self) -> Path:
        return self.parts / "torchrun.stdout"

    @property
    def torchrun_stderr(self) -> Path:
        return self.parts / "torchrun.stderr"

    @property
    def ranks_dir(self) -> Path:
        """torchrun's ``--log-dir``: ``<id>/attempt_N/<local rank>/{stdout,stderr}.log``."""
        return self.parts / "ranks"

    def create(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.ranks_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def remove_parts(self) -> None:
        """The scratch folder, once the job ended and its files were read to their end."""
        shutil.rmtree(self.parts, ignore_errors=True)

    def moved_beside(self, recording: str) -> JobLogPaths:
        """The log moved beside ``recording`` (``NAME.log`` for ``NAME.commtop``); unchanged
        if it is there already or cannot be moved (the path printed at exit says which)."""
        target = beside(recording)
        if target == self.log or not self.log.exists():
            return self
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.log), str(target))
        except OSError:
            return self
        return JobLogPaths(target, self.parts)


def beside(recording: str) -> Path:
    """The log's path beside a recording."""
    path = Path(recording)
    return path.with_suffix(".log") if path.suffix == ".commtop" else path.with_name(path.name + ".log")


def for_run(run_id: str, recording: str = "") -> JobLogPaths:
    """The paths of a new run's job log (beside ``recording`` if the run records from its start);
    prunes the state folder to the newest :data:`KEEP_LOGS` logs first."""
    root = logs_root()
    prune(root)
    log = beside(recording) if recording else root / f"{run_id}.log"
    return JobLogPaths(log, root / f"{run_id}{PARTS_SUFFIX}")


def prune(root: Path, keep: int = KEEP_LOGS, live_run_ids: set[str] | None = None) -> list[str]:
    """Keep the newest ``keep`` logs of ``root``; remove scratch folders whose run is gone
    (its folder in the runtime root no longer exists: it ended, or was pruned after a kill)."""
    from workers.wire import connection as connections

    removed: list[str] = []
    logs = sorted(root.glob("*.log"), key=_mtime, reverse=True)
    for old in logs[keep:]:
        try:
            old.unlink()
            removed.append(old.name)
        except OSError:
            pass
    if live_run_ids is None:
        try:
            runtime = connections.runtime_root()
            live_run_ids = {p.name for p in runtime.iterdir() if p.is_dir()}
        except (OSError, connections.ConnectionError_):
            return removed
    for parts in root.glob(f"*{PARTS_SUFFIX}"):
        if parts.is_dir() and parts.name[: -len(PARTS_SUFFIX)] not in live_run_ids:
            shutil.rmtree(parts, ignore_errors=True)
            removed.append(parts.name)
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
