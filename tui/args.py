"""argparse as every `commtop` command uses it: one error line with one prefix
(`commtop <sub>: error: ...`), and help that shows the defaults that matter."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """A bad value is one line: the usage block printed before it buried it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``(default: X)`` after each option's help, except where there is no default to show
    (None, False, an empty string) or the help already says it; epilogs keep their lines."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        default = action.default
        if default in (None, False, "") or default is argparse.SUPPRESS or "default" in help_text:
            return help_text
        return super()._get_help_string(action)


def version() -> str:
    """The installed commtop's version (the source tree's when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("commtop")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"
