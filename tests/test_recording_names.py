"""A recording says which code made it and is named after what ran: the real Recorder writing
real files, read back with the real reader."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import tomllib
from frozen_run import frozen_coll, frozen_hello

from tui.recordings import version
from tui.recordings.reader import open_recording
from tui.recordings.recorder import Recorder

REPO = Path(__file__).resolve().parent.parent


def record(tmp_path: Path, hellos_first: bool, path: str | None = None, **config: str) -> Recorder:
    """Start recording, then a 2-rank run's hellos (``config`` in them) and one batch each."""
    hellos = [frozen_hello(r, 2) for r in range(2)]
    for h in hellos:
        h.config.update(config)
    recorder = Recorder(collective="run", directory=tmp_path, flush_s=0.05)
    if hellos_first:
        for h in hellos:
            recorder.write(h)
    recorder.start(path)
    for r, h in enumerate(hellos):
        recorder.write(h)
        recorder.write(frozen_coll(r, 0, np.arange(10), np.full(10, 2000.0)))
    recorder.stop()
    return recorder


def test_watch_record_names_the_file_after_the_collective_once_a_hello_says_it(tmp_path: Path) -> None:
    recorder = record(tmp_path, hellos_first=False)  # `commtop watch --record`: no rank yet
    (only,) = tmp_path.iterdir()
    assert only.name.endswith("-all_gather.commtop") and "-run" not in only.name
    assert recorder.status().path == str(only)
    with open_recording(only) as rec:
        assert rec.complete and rec.records == 20


def test_a_user_jobs_recording_is_named_after_its_script(tmp_path: Path) -> None:
    record(tmp_path, hellos_first=False, source="monitor", collective="monitor: train_ddp.py")
    (only,) = tmp_path.iterdir()
    assert only.name.endswith("-train_ddp.commtop")


def test_a_name_known_at_the_start_or_given_is_kept(tmp_path: Path) -> None:
    record(tmp_path / "known", hellos_first=True)
    (only,) = (tmp_path / "known").iterdir()
    assert only.name.endswith("-all_gather.commtop")
    given = tmp_path / "mine.commtop"
    record(tmp_path, hellos_first=False, path=str(given))
    assert given.exists()


@pytest.mark.e2e
def test_a_recording_carries_the_package_version_and_the_commit(tmp_path: Path) -> None:
    record(tmp_path, hellos_first=True)
    (only,) = tmp_path.iterdir()
    with open_recording(only) as rec:
        carried = rec.meta["tool_version"]
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert carried == version.tool_version()
    assert carried.startswith(f"{metadata.version('commtop')}+g{head}"), carried
    assert "unknown" not in carried


def test_a_source_tree_that_is_not_installed_reads_its_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.metadata, "version", not_installed)
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version.package_version() == want
