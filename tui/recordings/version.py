"""The tool version a recording carries: the package's version, and the commit it ran from.

A recording made from a source tree (``pip install -e .``, or the tree on ``PYTHONPATH`` on a
GPU node) said "0+unknown" or "0.1.0" for any commit, so two recordings of different code could
not be told apart. Here: the installed package's version (``importlib.metadata``), else the
source tree's ``pyproject.toml``; plus ``git describe`` of the tree when it is a git checkout,
as a PEP 440 local version: ``0.1.0+g69038ea``.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata
from pathlib import Path

#: The source tree this module was imported from (tui/recordings/version.py -> the repo).
SOURCE_TREE = Path(__file__).resolve().parents[2]
UNKNOWN = "0+unknown"


@functools.cache
def tool_version() -> str:
    """``0.1.0+g69038ea`` / ``0.1.0`` / ``0+unknown``."""
    base = package_version() or UNKNOWN
    commit = git_describe(SOURCE_TREE)
    if not commit:
        return base
    local = "g" + commit
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
    """The abbreviated commit of ``tree`` (``69038ea``); "" when it is not a git checkout. Read
    from git's own files (HEAD, the branch's ref, packed-refs), so recording never starts a
    process nor waits on one; whether the tree has uncommitted changes is not told."""
    git = tree / ".git"
    try:
        if git.is_file():  # a worktree or submodule: "gitdir: PATH"
            git = (tree / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            common = git / "commondir"
            roots = [git] + ([(git / common.read_text().strip()).resolve()] if common.is_file() else [])
            head = next((r.joinpath(ref).read_text().strip() for r in roots if r.joinpath(ref).is_file()), "")
            if not head:
                head = next(
                    (
                        line.split()[0]
                        for r in roots
                        if (r / "packed-refs").is_file()
                        for line in (r / "packed-refs").read_text().splitlines()
                        if line.endswith(" " + ref)
                    ),
                    "",
                )
    except (OSError, IndexError):
        return ""
    return head[:7] if re.fullmatch(r"[0-9a-f]{40}", head) else ""
