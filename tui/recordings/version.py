"""The tool version a recording carries: the package's version, and the commit it ran from.

A recording made from a source tree (``pip install -e .``, or the tree on ``PYTHONPATH`` on a
GPU node) said "0+unknown" or "0.1.0" for any commit, so two recordings of different code could
not be told apart. Here: the installed package's version (``importlib.metadata``), else the
source tree's ``pyproject.toml``; plus ``git describe`` of the tree when it is a git checkout,
as a PEP 440 local version: ``0.1.0+g69038ea`` (``.dirty`` with uncommitted changes).
"""

from __future__ import annotations

import functools
import re
import subprocess
from importlib import metadata
from pathlib import Path

#: The source tree this module was imported from (tui/recordings/version.py -> the repo).
SOURCE_TREE = Path(__file__).resolve().parents[2]
UNKNOWN = "0+unknown"


@functools.cache
def tool_version() -> str:
    """``0.1.0+g69038ea`` / ``0.1.0+g69038ea.dirty`` / ``0.1.0`` / ``0+unknown``."""
    base = package_version() or UNKNOWN
    commit = git_describe(SOURCE_TREE)
    if not commit:
        return base
    local = "g" + commit.replace("-dirty", ".dirty")
    return f"{base}.{local}" if "+" in base else f"{base}+{local}"


def package_version() -> str:
    """The installed distribution's version, else the version in the source tree's pyproject.toml."""
    try:
        return metadata.version("commtop")
    except metadata.PackageNotFoundError:
        pass
    try:
        text = (SOURCE_TREE / "pyproject.toml").read_text()
    except OSError:
        return ""
    found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return found.group(1) if found else ""


def git_describe(tree: Path) -> str:
    """The abbreviated commit of ``tree`` (``69038ea``, ``69038ea-dirty``); "" when it is not a
    git checkout or git is missing. Bounded: 2 s at most, once per process."""
    if not (tree / ".git").exists():
        return ""
    try:
        out = subprocess.run(
            ["git", "-C", str(tree), "describe", "--always", "--dirty", "--abbrev=7", "--exclude", "*"],
            capture_output=True,
            text=True,
            timeout=2.0,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{4,40}(-dirty)?", commit) else ""
