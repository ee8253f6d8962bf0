"""What a live session runs under torchrun: commtop's synthetic loop, sized to fit this
machine, or a user's script (``commtop run -- python train.py``). Everything here is decided
and checked before a run's folder exists, so a bad size or command is one line and nothing
is left behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tui.run import torchrun_line
from tui.run.launcher import torchrun_argv, torchrun_prefix
from tui.run.log_store import JobLogPaths
from workers.wire.config import ConfigError, LoopConfig, config_from_args
from workers.wire.connection import Connection

#: Ranks on a machine without a GPU (gloo on the CPU).
CPU_RANKS = 2
#: What runs a user's script under the capture (python's arguments before the script).
BOOTSTRAP = ("-m", "workers.capture.bootstrap")
#: How torchrun is told to run it: ``--`` ends torchrun's options, else a script option that is a
#: prefix of one of torchrun's (``--start``, ``--log``, ``--max``) is refused as ambiguous before
#: the script runs (plain torchrun does that), or taken as torchrun's own.
RUN_BOOTSTRAP = ("-m", "--", "workers.capture.bootstrap")
#: Launchers that start the ranks themselves (a command, or the module ``python -m`` runs): under
#: commtop torchrun starts them, so the script runs directly; what the launcher gives it instead.
_ACCELERATE = ("accelerate launch", "Accelerator() reads torchrun's environment; on a CPU, Accelerator(cpu=True)")
_DEEPSPEED = ("deepspeed", "deepspeed.initialize() reads LOCAL_RANK from torchrun's environment")
OTHER_LAUNCHERS = {
    "accelerate": _ACCELERATE,  # with the subcommand ``launch`` (SUBCOMMAND_LAUNCHERS)
    "accelerate.commands.accelerate_cli": _ACCELERATE,  # the same, as python -m
    "accelerate-launch": _ACCELERATE,
    "accelerate.commands.launch": _ACCELERATE,
    "deepspeed": _DEEPSPEED,
    "deepspeed.pt": _DEEPSPEED,
    "ds": _DEEPSPEED,
    "deepspeed.launcher.runner": _DEEPSPEED,
    "mpirun": ("mpirun", "N ranks on this node"),
    "mpiexec": ("mpiexec", "N ranks on this node"),
    "srun": ("srun", "N ranks on this node"),
    "torchx": ("torchx", "N ranks on this node"),
}
#: Launchers that start ranks only by one subcommand (``accelerate env`` starts none).
SUBCOMMAND_LAUNCHERS = {"accelerate": "launch", "accelerate.commands.accelerate_cli": "launch"}


@dataclass(frozen=True)
class JobPlan:
    """One job: how many ranks, what they run, and how the run, its recording and its TUI
    header are named."""

    nproc: int
    #: the run's label (the tail of its folder's name)
    label: str
    #: the recording's name: the loop's collective, or "monitor" for a user's script
    collective: str
    #: the TUI's header
    title: str = "commtop"
    #: the synthetic loop's settings; None: ``script`` runs instead
    loop: LoopConfig | None = None
    #: a user's command (``python train.py ARGS``), run under torchrun by :func:`script_argv`
    script: tuple[str, ...] = ()

    def argv(self, conn: Connection, logs: JobLogPaths | None = None) -> list[str]:
        """torchrun's command line (the loop's workers are told the run's connection file);
        with ``logs``, each rank writes its output into its own files there."""
        if self.loop is not None:
            return torchrun_argv(self.nproc, self.loop.to_argv(), conn, logs)
        return script_argv(list(self.script), self.nproc, logs)


def loop_plan(ns: argparse.Namespace) -> JobPlan:
    """`commtop run`'s synthetic loop: one rank per visible GPU (or ``--nproc``), or gloo ranks
    on the CPU when there is no GPU (said on stderr); refuses sizes that cannot fit."""
    from tui.run.gpus import visible_gpus

    gpus = visible_gpus()
    cpu = gpus.count == 0 or ns.backend == "gloo"
    if ns.backend == "nccl" and gpus.count == 0:
        raise ConfigError(f"--backend nccl needs a GPU: {gpus.reason}")
    nproc = ns.nproc if ns.nproc is not None else (CPU_RANKS if cpu else gpus.count)
    if nproc < 1:
        raise ConfigError("--nproc must be at least 1")
    if not cpu and nproc > gpus.count:
        raise ConfigError(f"--nproc {nproc} but only {gpus.count} GPU(s) are visible")
    config = config_from_args(ns, cpu=cpu)
    check_memory(config, nproc, cpu, gpus.memory_bytes)
    if cpu:
        why = gpus.reason if gpus.count == 0 else "--backend gloo"
        print(f"commtop: no GPU ({why}): running {nproc} gloo ranks on the CPU (backend gloo/cpu)", file=sys.stderr)
    title = f"commtop run · {nproc} ranks · {'gloo/cpu' if cpu else 'nccl'}"
    return JobPlan(nproc, label=config.collective, collective=config.collective, title=title, loop=config)


def script_plan(script: list[str], nproc: int | None) -> JobPlan:
    """`commtop run -- CMD ...`: the user's own script, unmodified (read through
    ``workers.capture.bootstrap``) or using ``workers.monitor``, under torchrun, one rank per
    visible GPU (or ``nproc``); the run is named after it. A script that does not exist is
    refused here, before anything starts."""
    from tui.run.gpus import visible_gpus

    rest = _command(script)  # a command with nothing to run, or a missing file: one line, now
    runnable = runnable_script(rest, on_path=not torchrun_line.is_torchrun(script))
    if runnable != rest:  # a console script found on PATH: python runs its file
        script = [*script[: len(script) - len(rest)], *runnable]
        rest = runnable
    check_own_package_name(rest)
    gpus = visible_gpus()
    ranks = nproc if nproc is not None else (gpus.count or CPU_RANKS)
    if torchrun_line.is_torchrun(script):
        ranks = _torchrun_ranks(torchrun_line.parse(script), nproc, ranks)
    if ranks < 1:
        raise ConfigError("--nproc must be at least 1")
    label = script_label(script, rest)
    title = f"commtop run · {' '.join(script)[:60]}"
    return JobPlan(ranks, label=label, collective="monitor", title=title, script=tuple(script))


def interpreter_note(script: list[str]) -> str:
    """One line when the command names a python of another environment than commtop's (``--
    /usr/bin/python3 train.py``, or a ``python`` on PATH from another virtualenv): the ranks run
    commtop's, whose packages are the ones the job gets; "" when it is commtop's own. Two
    spellings in one ``bin`` folder (python, python3) are one environment."""
    if not script or not os.path.basename(script[0]).startswith("python"):
        return ""
    named = shutil.which(script[0])
    if named is None or os.path.dirname(os.path.abspath(named)) == os.path.dirname(os.path.abspath(sys.executable)):
        return ""
    return (
        f"the ranks run commtop's python ({sys.executable}), not {named}: the job imports the "
        "packages of commtop's environment; install commtop into the job's environment to run with its own"
    )


#: commtop's rank-side package: every rank imports it before the script runs.
OWN_PACKAGE = "workers"


def check_own_package_name(rest: list[str]) -> None:
    """ConfigError (one line) where a job has a module of its own named like commtop's rank-side
    package, in the folder python searches first: the current one (the ranks start the
    bootstrap with ``-m``) or the script's. One shadows the other (every rank failed on
    "'workers' is not a package", or the script imported commtop's in place of its own); the
    package's name is fixed, so this is said before anything starts."""
    folders = [("the current folder", Path.cwd())]
    if rest and rest[0] != "-m":
        folders.append(("the script's folder", Path(rest[0]).resolve().parent))
    for where, folder in folders:
        module, package = folder / f"{OWN_PACKAGE}.py", folder / OWN_PACKAGE
        if module.is_file() or (package.is_dir() and any(package.glob("*.py"))):
            found = module if module.is_file() else package
            if found.resolve() == Path(__file__).resolve().parents[2] / OWN_PACKAGE:
                continue  # commtop's own (a run from its checkout)
            raise ConfigError(
                f"{where} holds a Python module named {OWN_PACKAGE!r} ({found}), the name of commtop's own "
                "rank-side package: one would be imported in place of the other. Rename yours (or move it "
                "into a package of your own), or run the job without commtop"
            )


def runnable_script(rest: list[str], on_path: bool = True) -> list[str]:
    """``rest`` (what python runs: ``train.py ARGS`` or ``-m mod ARGS``) if python can run it as a
    rank, with a console script (``my-trainer ARGS``, a pip-installed Python file) found on PATH
    when ``on_path``. ConfigError, one line, for a launcher that starts ranks itself (accelerate,
    deepspeed, mpirun: each rank would start a launcher of its own), a file that is not Python
    (a shell script, a binary) and a missing file."""
    if not rest:
        return rest
    command, args = (rest[1], rest[2:]) if rest[0] == "-m" and len(rest) > 1 else (os.path.basename(rest[0]), rest[1:])
    other, subcommand = OTHER_LAUNCHERS.get(command), SUBCOMMAND_LAUNCHERS.get(command)
    if other is not None and (subcommand is None or args[:1] == [subcommand]):
        name, gives = other
        raise ConfigError(
            f"{name} starts the ranks itself, and under commtop torchrun does: run the script directly, "
            f"`commtop run --nproc N -- python train.py ARGS` ({gives})"
        )
    if rest[0] == "-m":
        return rest
    path = rest[0]
    if not os.path.isfile(path):
        found = shutil.which(path) if on_path and os.sep not in path else None
        if found is None:
            why = "is a directory" if os.path.isdir(path) else "no such file"
            raise ConfigError(f"cannot run {path!r}: {why}")
        path = found
    what = _not_python(path)
    if what:
        env = (
            "; set variables before commtop: `FOO=1 commtop run -- python ...`"
            if os.path.basename(path) == "env"
            else ""
        )
        raise ConfigError(
            f"cannot run {rest[0]!r}: {what}, not a Python script; commtop run needs the python command "
            f"it runs: `-- python train.py ARGS` or `-- torchrun OPTIONS train.py ARGS`{env}"
        )
    return [path, *rest[1:]]


def _not_python(path: str) -> str:
    """What the file at ``path`` is if python cannot run it ("a program", "a #!/bin/bash script"),
    else "" (a Python file, with or without ``#!``, or one that cannot be read: python says why)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return ""
    if head.startswith((b"\x7fELF", b"MZ", b"\xcf\xfa\xed\xfe")):
        return "a program"
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
        if "python" not in line:
            return f"a #!{line} script"
    return ""


def _torchrun_ranks(line: torchrun_line.TorchrunLine, nproc: int | None, guess: int) -> int:
    """Ranks per node of a user's torchrun line: its ``--nproc-per-node``, else ``--nproc``
    (added to the line), else torchrun's default, 1; ``guess`` for ``gpu``/``auto``."""
    if "--nproc-per-node" not in line.given:
        return nproc if nproc is not None else 1
    if nproc is not None and nproc != line.nproc:
        raise ConfigError("--nproc and the torchrun line's --nproc-per-node disagree: give one of them")
    return line.nproc if line.nproc is not None else guess


def script_label(script: list[str], rest: list[str]) -> str:
    """What the run, its log and its recording are named after: the script's name (``train``
    of ``train.py``), a module's last part (``train`` of ``-m pkg.train``), else "script"."""
    if rest[:1] == ["-m"]:
        return rest[1].rsplit(".", 1)[-1] or "script"
    fallback = Path(rest[0]).stem if rest and not rest[0].startswith("-") else ""  # a console script
    return next((Path(a).stem for a in script if a.endswith(".py")), fallback or "script")


def script_argv(script: list[str], nproc: int, logs: JobLogPaths | None = None) -> list[str]:
    """torchrun on this node for ``python x.py ARGS``, ``python -m mod ARGS`` or ``x.py ARGS``;
    a user's own ``torchrun OPTIONS x.py ARGS`` keeps its options (with commtop's log files and
    monitor interval unless it sets its own). Either way the script runs through the capture
    bootstrap, with this interpreter. Raises ConfigError (one line) for a command with nothing
    to run, or one commtop cannot watch."""
    # The bootstrap captures collectives and copies of the unmodified script, then runs it as __main__.
    if torchrun_line.is_torchrun(script):
        line = torchrun_line.parse(script)
        ours = ["--monitor-interval=0.2"] if "--monitor-interval" not in line.given else []
        if "--nproc-per-node" not in line.given:
            ours.append(f"--nproc-per-node={nproc}")
        if logs is not None and not line.given & torchrun_line.OUTPUT_OPTIONS:
            ours += ["--log-dir", str(logs.ranks_dir), "--redirects", "3"]
        launcher = [sys.executable, "-m", line.launcher]  # launch's --local-rank=N reaches the script
        watched = line.target[:2] in (BOOTSTRAP, ("-m", "workers"))  # already
        target = ["-m", "--", *line.target[1:]] if watched else [*RUN_BOOTSTRAP, *line.target]
        return [*launcher, *line.options, *ours, *target]
    flags = [f for f in torchrun_line.split_python(script)[0] if f != "-u"]  # torchrun's own -u
    if flags:  # -O, -X dev, -W error: each rank's python is started with them, as the script asked
        return [
            *torchrun_prefix(nproc, logs),
            "--no-python",
            "--",
            sys.executable,
            *flags,
            *BOOTSTRAP,
            *_command(script),
        ]
    return [*torchrun_prefix(nproc, logs), *RUN_BOOTSTRAP, *_command(script)]


def _command(script: list[str]) -> list[str]:
    """What python runs (``train.py ARGS`` or ``-m mod ARGS``), also under a torchrun line."""
    if torchrun_line.is_torchrun(script):
        target = list(torchrun_line.parse(script).target)
        return target[2:] if tuple(target[:2]) == BOOTSTRAP and len(target) > 2 else target
    rest = torchrun_line.after_python(script)
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        raise ConfigError(f"nothing to run in {' '.join(script)!r}; expected e.g. `-- python train.py`")
    return rest


def check_memory(config: LoopConfig, nproc: int, cpu: bool, gpu_memory: tuple[int, ...]) -> None:
    """Refuse sizes that cannot fit before any rank starts (a clear error, not an OOM later)."""
    import psutil

    available = psutil.virtual_memory().available
    host_need = nproc * config.peak_host_bytes() + (nproc * config.peak_device_bytes(nproc) if cpu else 0)
    if host_need > 0.8 * available:
        raise ConfigError(
            f"{config.collective} of {'x'.join(map(str, config.shape))} {config.dtype} on {nproc} "
            f"ranks needs ~{host_need / 2**30:.1f} GiB of host memory; {available / 2**30:.1f} GiB "
            "is available (use a smaller --shape)"
        )
    if not cpu and gpu_memory:
        need = config.peak_device_bytes(nproc)
        if need > 0.9 * min(gpu_memory):
            raise ConfigError(
                f"needs ~{need / 2**30:.1f} GiB per GPU; the smallest has "
                f"{min(gpu_memory) / 2**30:.1f} GiB (use a smaller --shape)"
            )
