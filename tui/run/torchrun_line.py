"""A user's own torchrun line (`commtop run -- torchrun --nproc-per-node 8 train.py --lr 0.1`),
split into torchrun's options and what it runs, so commtop can put its capture bootstrap in
between and watch the script, as it does for `-- python train.py`.

torchrun's options are read as its own parser reads them (torch 2.13's
``torch.distributed.run.get_args_parser``: which take a value, ``--opt=value``, unique
prefixes), without importing torch here: the viewer never does. An option this list does not
know is refused in one line rather than guessed at, since guessing wrong would run an option's
value as the script.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from workers.wire.config import ConfigError

#: torchrun's options that take no value (besides -h), by every spelling.
FLAGS = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
        "--use-env",  # torch.distributed.launch's only
        "--use_env",
    }
)
#: torchrun's options that take one value.
VALUES = frozenset(
    {
        "--nnodes",
        "--nproc-per-node",
        "--nproc_per_node",
        "--rdzv-backend",
        "--rdzv_backend",
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        "--rdzv-id",
        "--rdzv_id",
        "--rdzv-conf",
        "--rdzv_conf",
        "--max-restarts",
        "--max_restarts",
        "--monitor-interval",
        "--monitor_interval",
        "--start-method",
        "--start_method",
        "--event-log-handler",
        "--event_log_handler",
        "--role",
        "--log-dir",
        "--log_dir",
        "-r",
        "--redirects",
        "-t",
        "--tee",
        "--local-ranks-filter",
        "--local_ranks_filter",
        "--duplicate-stdout-filters",
        "--duplicate_stdout_filters",
        "--duplicate-stderr-filters",
        "--duplicate_stderr_filters",
        "--node-rank",
        "--node_rank",
        "--master-addr",
        "--master_addr",
        "--master-port",
        "--master_port",
        "--local-addr",
        "--local_addr",
        "--logs-specs",
        "--logs_specs",
        "--numa-binding",
        "--numa_binding",
        "--signals-to-handle",
        "--signals_to_handle",
        "--shutdown-timeout",
        "--shutdown_timeout",
    }
)
#: Options whose output handling replaces commtop's own per-rank log files (as ``given`` spells them).
OUTPUT_OPTIONS = frozenset({"--log-dir", "-r", "--redirects", "-t", "--tee"})


@dataclass(frozen=True)
class TorchrunLine:
    """A torchrun command line taken apart."""

    #: torchrun's options as given (each an ``--opt``, ``--opt=value`` or ``--opt value``
    #: pair), without ``-m``/``--module`` and ``--run-path``: they say how the target runs
    options: tuple[str, ...]
    #: what the workers run: ``("train.py", ARGS...)`` or ``("-m", "pkg.train", ARGS...)``
    target: tuple[str, ...]
    #: ``--nproc-per-node`` when it is a number
    nproc: int | None
    #: the option names given (full, with dashes: ``--log-dir``), e.g. to leave the output alone
    given: frozenset[str]
    #: the module that runs it: ``torch.distributed.launch`` (deprecated; without ``--use-env`` it
    #: passes ``--local-rank=N`` to the script, which older scripts read) or ``torch.distributed.run``
    launcher: str = "torch.distributed.run"


def is_torchrun(command: list[str]) -> bool:
    """``torchrun ...`` or ``python -m torch.distributed.run ...`` (or ``.launch``)."""
    if not command:
        return False
    if os.path.basename(command[0]) == "torchrun":
        return True
    rest = after_python(command)
    return rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"])


#: python's own options whose value is the next word (``-W error``; ``-Werror`` is one word).
_PYTHON_VALUE_FLAGS = ("-W", "-X", "--check-hash-based-pycs")


def split_python(command: list[str]) -> tuple[list[str], list[str]]:
    """(python's own flags, what it runs) of a ``python [FLAGS] ...`` command: ``(["-O", "-X",
    "dev"], ["train.py", ARGS])`` or ``([], ["-m", "mod", ARGS])`` (``-mmod``, python's joined
    spelling, too); without ``python``, ``([], command)``. ConfigError for ``python -c``, which
    runs no script."""
    rest = list(command)
    flags: list[str] = []
    if rest and os.path.basename(rest[0]).startswith("python"):
        rest = rest[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            token = rest[0]
            if token.startswith("-c"):
                raise ConfigError("python -c runs no script: put the code in a file and run that")
            if token.startswith("-m"):  # -mpkg.train
                rest = ["-m", token[2:], *rest[1:]]
                break
            taken = 2 if token in _PYTHON_VALUE_FLAGS else 1
            flags += rest[:taken]
            rest = rest[taken:]
    return flags, rest


def after_python(command: list[str]) -> list[str]:
    """What a ``python [FLAGS] ...`` command runs (``train.py ARGS`` or ``-m mod ARGS``), python's
    own flags left out (:func:`split_python`)."""
    return split_python(command)[1]


def _spelling(option: str) -> str:
    """The full option ``option`` names (argparse takes a unique prefix of a long option)."""
    if option in FLAGS or option in VALUES:
        return option
    if option.startswith("--"):
        matches = {o for o in FLAGS | VALUES if o.startswith(option) and o.startswith("--")}
        # both spellings of one option (--nproc-per / --nproc_per) are one match
        if len({m.replace("_", "-") for m in matches}) == 1:
            return sorted(matches)[0]
    raise ConfigError(
        f"unknown torchrun option {option!r}: write it as {option}=VALUE, or start "
        "the script yourself under `torchrun ... -m workers.capture.bootstrap train.py` and `commtop watch`"
    )


def parse(command: list[str]) -> TorchrunLine:
    """``command`` (``torchrun ...`` or ``python -m torch.distributed.run ...``) taken apart;
    ConfigError (one line) when it runs nothing commtop can watch."""
    bare = os.path.basename(command[0]) == "torchrun"
    rest = command[1:] if bare else after_python(command)[2:]
    launcher = "torch.distributed.run" if bare else after_python(command)[1]
    options: list[str] = []
    given: set[str] = set()
    module = no_python = False
    nproc: int | None = None
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "-":
        token = rest[i]
        name, eq, value = token.partition("=")
        if name in ("-h", "--help"):
            raise ConfigError("torchrun's --help runs no job")
        full = _spelling(name)
        given.add(full.replace("_", "-"))
        if full in ("--use-env", "--use_env") and launcher != "torch.distributed.launch":
            raise ConfigError(f"{name} is torch.distributed.launch's option, not torchrun's")
        if full in FLAGS:
            if eq:
                raise ConfigError(f"torchrun's {name} takes no value")
            if full in ("-m", "--module"):
                module = True
            elif full in ("--no-python", "--no_python"):
                no_python = True
            elif full not in ("--run-path", "--run_path"):
                options.append(token)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(rest):
                raise ConfigError(f"torchrun's {name} needs a value")
            value = rest[i + 1]
            options += [token, value]
            i += 2
        else:
            options.append(token)
            i += 1
        if full.replace("_", "-") == "--nproc-per-node":
            nproc = int(value) if value.isdigit() else None
    target = rest[i:]
    if not target:
        raise ConfigError(f"nothing to run in {' '.join(command)!r}; expected e.g. `torchrun ... train.py`")
    if no_python:
        raise ConfigError(
            "torchrun --no-python runs a program that is not Python: commtop cannot watch it "
            "(run the Python script itself: `commtop run -- torchrun ... train.py`)"
        )
    target = ["-m", *target] if module else target
    return TorchrunLine(tuple(options), tuple(target), nproc, frozenset(given), launcher)
