"""Every module of both packages imports in a clean interpreter, and the layers hold at run time:
the viewer never loads torch, the shared wire code loads neither torch, zmq nor textual, and only
tui.view loads textual. (pyproject.toml states the same layers as import-linter contracts, which
CI checks statically; this test sees what importing really pulls in, lazily imported or not.)
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import tui
import workers


def modules(package: object) -> list[str]:
    """Every module below ``package``, found on disk (a new module is covered without a list);
    ``__main__`` modules are left out: importing them runs the program."""
    found = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]  # type: ignore[attr-defined]
    return sorted(m for m in found if not m.endswith("__main__"))


def loaded_after_importing(names: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` are in sys.modules after importing ``names`` in a fresh interpreter."""
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(','.join(w for w in {watched!r} if w in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.strip().split(",") if w]


def test_discovery_finds_every_package_of_the_layout() -> None:
    tui_modules, worker_modules = modules(tui), modules(workers)
    for expected in ("tui.cli", "tui.model.run_model", "tui.view.app", "tui.recordings.reader", "tui.report.build"):
        assert expected in tui_modules
    for expected in ("workers.wire.protocol", "workers.rank.timing", "workers.synthetic.loop", "workers.monitor.api"):
        assert expected in worker_modules


@pytest.mark.e2e
def test_no_viewer_module_loads_torch() -> None:
    assert loaded_after_importing(modules(tui), ("torch",)) == []


@pytest.mark.e2e
def test_the_shared_wire_code_loads_no_torch_zmq_or_textual() -> None:
    wire = [m for m in modules(workers) if m.startswith("workers.wire")]
    assert loaded_after_importing(wire, ("torch", "zmq", "textual")) == []


@pytest.mark.e2e
def test_only_the_view_loads_textual() -> None:
    headless = [m for m in modules(tui) if not m.startswith("tui.view") and m != "tui.cli"]
    assert loaded_after_importing(headless, ("textual",)) == []


@pytest.mark.e2e
def test_every_worker_module_imports() -> None:
    assert loaded_after_importing(modules(workers), ("tui", "textual")) == []
