"""The TUI side never imports torch (it must start fast and run where torch is absent)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

MODULES = [
    "tui.view.app",
    "tui.model.run_model",
    "tui.model.ingest",
    "tui.model.sources",
    "tui.run.headless",
    "tui.cli",
]


def test_tui_modules_do_not_import_torch() -> None:
    present = [m for m in MODULES if importlib.util.find_spec(m) is not None]
    assert "tui.model.run_model" in present and "tui.model.sources" in present
    code = "import sys\n" + "".join(f"import {m}\n" for m in present) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_model_does_not_import_textual() -> None:
    code = "import sys, tui.model.run_model, tui.model.ingest, tui.run.headless; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
