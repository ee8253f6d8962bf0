"""argparse as every `commtop` command uses it: one error line with one prefix
(`commtop <sub>: error: ...`), help that shows the defaults that matter, and subcommands
whose options are added by their own module when they are used."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, TypeVar, overload

_N = TypeVar("_N")


class OneLineParser(argparse.ArgumentParser):
    """A bad value is one line: the usage block printed before it buried it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


class CommandParser(OneLineParser):
    """The parser of one `commtop` subcommand.

    ``arguments``: adds the subcommand's options (and description) when the subcommand is
    parsed or its help is shown, so its module is imported only then (`commtop run` does not
    import what `commtop report` needs). ``script``: everything after the first ``--`` is a
    command to run, in ``ns.script`` (None without ``--``; argparse must not read its options).
    """

    def __init__(
        self,
        *args: Any,
        arguments: Callable[[argparse.ArgumentParser], None] | None = None,
        script: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments
        self._script = script

    def _load(self) -> None:
        arguments, self._arguments = self._arguments, None
        if arguments is not None:
            arguments(self)

    def format_help(self) -> str:
        self._load()
        return super().format_help()

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        self._load()
        argv = list(sys.argv[1:] if args is None else args)
        script: list[str] | None = None
        if self._script and "--" in argv:
            cut = argv.index("--")
            argv, script = argv[:cut], argv[cut + 1 :]
        ns, extras = super().parse_known_args(argv, namespace)
        if self._script:
            ns.script = script
        return ns, extras


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
