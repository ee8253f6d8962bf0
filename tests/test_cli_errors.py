"""Bad command lines and unusable addresses: one clear line on stderr, a non-zero exit, and
nothing started (no rank, no connection file left behind to be mistaken for a run)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from synthetic_ranks import PY, REPO

from workers.wire.connection import create_run

pytestmark = pytest.mark.timeout(120)
COMMTOP = [PY, "-m", "tui.cli"]
WORKER = [PY, "-m", "workers"]


@dataclass(frozen=True)
class Result:
    argv: list[str]
    code: int
    err: list[str]  # non-empty stderr lines
    out: str
    seconds: float


def call(argv: list[str], env: dict[str, str], timeout_s: float = 60) -> Result:
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return Result(argv, proc.returncode, lines, proc.stdout, time.monotonic() - t0)


def one_line_error(res: Result, *words: str) -> None:
    shown = "\n".join(res.err)
    assert res.code != 0, f"{res.argv}: exit 0\n{shown}"
    assert len(res.err) == 1, f"{res.argv}: expected one line, got:\n{shown}"
    line = res.err[0]
    assert line.startswith(("commtop", "commtop worker")) and "Traceback" not in line
    for word in words:
        assert word.lower() in line.lower(), f"{word!r} not in {line!r}"


BAD_RUN = {
    "zero dimension": (["--shape", "0x5"], "positive"),
    "not a shape": (["--shape", "abc"], "8192x8192"),
    "too many elements": (["--shape", "8192x8192x8192"], "elements"),
    "unknown dtype": (["--dtype", "float8"], "dtype"),
    "unknown collective": (["--collective", "all_everything"], "collective"),
    "too large for memory": (["--shape", "100000x100000"], "memory"),
    "too many copies": (["--copies", "99999"], "copies"),
    "no ranks": (["--nproc", "0"], "nproc"),
    "negative iterations": (["--iters", "-1"], "negative"),
    "missing script": (["--", "python", "nope.py"], "cannot run 'nope.py': no such file"),
    "another launcher": (["--", "accelerate", "launch", "train.py"], "accelerate launch starts the ranks itself"),
}


@pytest.mark.e2e
def test_invalid_run_values_fail_in_one_line_before_any_rank_starts(rt) -> None:
    root, env = rt
    with ThreadPoolExecutor(3) as pool:
        results = dict(
            zip(
                BAD_RUN,
                pool.map(lambda a: call([*COMMTOP, "run", "--headless", *a[0]], env), BAD_RUN.values()),
                strict=True,
            )
        )
    for name, res in results.items():
        one_line_error(res, BAD_RUN[name][1])
        assert res.code == 2
        print(f"\n[cli] {name}: {res.err[0]} ({res.seconds:.2f} s)", end="")
    # Nothing was started: no run directory (torchrun gets one before it starts), no job log.
    assert list(root.iterdir()) == []
    assert not list(root.rglob("job.log"))


@pytest.mark.e2e
def test_missing_connection_file_is_one_line_everywhere(rt) -> None:
    _root, env = rt
    missing = "/nonexistent/commtop/connection.json"
    cases = {
        "watch": [*COMMTOP, "watch", "--headless", "--connection-file", missing],
        "ctl": [*COMMTOP, "ctl", "--run", missing, "status"],
        "worker": [*WORKER, "--connection-file", missing, "--iters", "1"],
    }
    with ThreadPoolExecutor(3) as pool:
        results = dict(zip(cases, pool.map(lambda a: call(a, env), cases.values()), strict=True))
    for name, res in results.items():
        one_line_error(res, "connection file", missing)
        assert res.code == 2, name
        assert res.seconds < 15, f"{name} took {res.seconds:.1f} s: it got further than checking its arguments"


@pytest.mark.e2e
def test_port_in_use_is_one_line_and_leaves_no_run_behind(rt) -> None:
    root, env = rt
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        # PORT itself taken, and PORT+1 (the control endpoint) taken.
        for listen in (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port - 1}"):
            res = call([*COMMTOP, "watch", "--headless", "--listen", listen], env)
            one_line_error(res, "cannot listen", str(port), "in use")
    finally:
        holder.close()
    assert list(root.iterdir()) == []  # no stale connection file that `ctl` would pick as the newest run


@pytest.mark.e2e
def test_ipc_path_in_use_and_run_already_watched(rt) -> None:
    _root, env = rt
    conn = create_run(label="busy")
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.PULL)  # somebody else listens on the run's data socket
    squatter.bind(conn.data)
    try:
        res = call([*COMMTOP, "watch", "--headless", "--connection-file", conn.path], env)
        one_line_error(res, "cannot listen", conn.data, "in use")
    finally:
        squatter.close(0)
        ctx.term()
    first = subprocess.Popen(
        [*COMMTOP, "watch", "--headless", "--connection-file", conn.path],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stderr is not None
        first.stderr.readline()  # it is listening once it prints
        res = call([*COMMTOP, "watch", "--headless", "--connection-file", conn.path], env)
        one_line_error(res, "already being watched", str(first.pid))
        assert first.poll() is None, "the first collector must not be disturbed"
    finally:
        first.kill()
        first.wait(5)


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [
        ("not-an-endpoint", ("tcp://HOST:PORT",)),
        ("tcp://127.0.0.1:99999", ("tcp://HOST:PORT",)),
        ("tcp://no-such-host.invalid:5555", ("cannot resolve", "no-such-host.invalid")),
    ],
)
@pytest.mark.e2e
def test_unusable_connect_address_is_one_line_before_torch(
    rt, endpoint: str, words: tuple[str, ...], tmp_path: Path
) -> None:
    _root, env = rt
    conn = create_run(label="connect")
    # Checked before `import torch` (seconds): a stand-in torch that ends the process says so if
    # it was imported (deterministic, where a time bound would depend on the machine's load).
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('torch imported')\n")
    env = {**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"}
    res = call([*WORKER, "--connection-file", conn.path, "--connect", endpoint, "--iters", "1"], env)
    assert "torch imported" not in res.err
    one_line_error(res, *words)
    assert res.code == 2


@pytest.mark.e2e
def test_unreachable_connect_address_warns_once_and_the_job_runs(rt) -> None:
    """Nobody listens at a well-formed address: the profiler must not take the job down.
    The worker says so in one line and runs to the end (its records are dropped, counted)."""
    _root, env = rt
    conn = create_run(label="unreachable")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    res = call(
        [*WORKER, "--connection-file", conn.path, "--connect", f"tcp://127.0.0.1:{port}", "--iters", "20"],
        env,
    )
    assert res.code == 0, "\n".join(res.err)
    assert res.err == [
        f"commtop worker rank 0: no collector at tcp://127.0.0.1:{port} yet; running anyway "
        "(records are dropped until one listens)"
    ]
    assert '"iterations": 20' in res.out and '"sent": 0' in res.out


@pytest.mark.e2e
def test_commtop_without_a_collector_for_ctl_is_one_line(rt) -> None:
    """`commtop ctl` against a run whose collector is gone: no answer, one line, exit 1."""
    _root, env = rt
    conn = create_run(label="gone")
    res = call([*COMMTOP, "ctl", "--run", conn.path, "--timeout", "0.5", "status"], env)
    one_line_error(res)
    assert res.code == 1


if __name__ == "__main__":  # pragma: no cover - manual runs
    sys.exit(pytest.main([__file__, "-q", "-s"]))


# --------------------------------------------------------------------------- item 12 (issue 16)


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    """tui.cli.main in-process: (exit code, stdout, non-empty stderr lines)."""
    from tui.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's -h, --version and errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, [ln for ln in err.splitlines() if ln.strip()]


def test_version_is_the_installed_one(capsys) -> None:
    from importlib.metadata import version

    code, out, err = _main(["--version"], capsys)
    assert (code, out.strip(), err) == (0, f"commtop {version('commtop')}", [])


def test_run_help_shows_the_script_form_and_the_defaults(capsys) -> None:
    code, out, _ = _main(["run", "-h"], capsys)
    text = " ".join(out.split())  # argparse wraps lines at the terminal's width
    assert code == 0
    assert "commtop run [--nproc N] [--headless] [--record [PATH]] -- CMD [ARGS ...]" in text
    assert "commtop run -- python examples/train_ddp_plain.py" in text
    assert "unmodified" in text and "instrumented with workers.monitor" not in text  # the README's promise
    for option, default in (("--copies", "5"), ("--collectives-per-step", "32"), ("--warmup", "5")):
        after = text[text.index(option + " ") :]
        assert f"(default: {default})" in after[: after.index(" --", 3)], (option, after[:200])
    assert "(default: None)" not in text and "(default: False)" not in text


def test_every_subcommand_is_documented(capsys) -> None:
    _, top, _ = _main(["-h"], capsys)
    assert "ctl status | mode MODE | set NAME=VALUE" in " ".join(top.split())
    _, replay, _ = _main(["replay", "-h"], capsys)
    assert "FILE" in replay and "--speed" in replay and "(default: 1.0)" in replay
    _, watch, _ = _main(["watch", "-h"], capsys)
    assert "--record [PATH]" in watch and "record to PATH" in watch
    _, ctl_help, _ = _main(["ctl", "-h"], capsys)
    assert "commtop ctl mode sync-barrier" in ctl_help and "before or after the subcommand" in ctl_help


@pytest.mark.parametrize(
    ("argv", "sub", "words"),
    [
        (["run", "--copies", "99"], "run", "copies"),
        (["run", "--"], "run", "nothing to run"),
        (["run", "--", "python", "nope.py"], "run", "cannot run 'nope.py': no such file"),
        (["run", "--frobnicate"], "run", "unrecognized arguments: --frobnicate"),
        (["report", "x.commtop", "--frobnicate"], "report", "unrecognized arguments: --frobnicate"),
        (["run", "--nproc", "x"], "run", "invalid int"),
        (["watch", "--listen", "tcp://nope"], "watch", "--listen"),
        (["replay"], "replay", "required: FILE"),
        (["replay", "/nonexistent.commtop"], "replay", "nonexistent"),
        (["report"], "report", "required: file"),
        (["report", "/nonexistent.commtop"], "report", "nonexistent"),
        (["ctl", "mode"], "ctl", "required: MODE"),
        (["ctl", "set", "copies=99"], "ctl", "copies"),
        (["frobnicate"], "", "invalid choice"),
    ],
)
@pytest.mark.e2e
def test_one_error_line_with_the_subcommands_prefix(rt, capsys, argv: list[str], sub: str, words: str) -> None:
    code, out, err = _main(argv, capsys)
    assert code in (1, 2) and out == "", (code, out)
    assert len(err) == 1, err
    who = err[0].split(": error: ", 1)[0].split()  # "commtop ctl mode": the subcommand's own parser
    assert who[:2] == (["commtop", sub] if sub else ["commtop"]) and len(who) <= 3, err
    assert words.lower() in err[0].lower(), err
