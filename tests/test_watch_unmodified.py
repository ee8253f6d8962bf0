"""The line `commtop watch` prints for your own script, run as printed, brings an unmodified
script's ranks (real `commtop watch --headless`, real torchrun from this environment's PATH,
2 gloo ranks of a script that knows nothing of commtop). Before, the line was
`COMMTOP_CONNECTION_FILE=... torchrun ... train.py` and the job never appeared."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from synthetic_ranks import PY, REPO, child_env, short_runtime_dir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]  # starts processes

#: A script that knows nothing of commtop: N SGD steps, each gradient all_reduced (no eval after).
UNMODIFIED = Path(__file__).parent / "jobs" / "eval_after_last_step.py"


def test_the_printed_line_for_an_unmodified_script_brings_its_ranks(tmp_path: Path) -> None:
    root = short_runtime_dir()
    env = child_env(root)
    env["PATH"] = f"{Path(PY).parent}{os.pathsep}{env.get('PATH', '')}"  # this environment's torchrun
    script = tmp_path / "train.py"
    shutil.copy(UNMODIFIED, script)
    watch = subprocess.Popen(
        [PY, "-m", "tui.cli", "watch", "--headless"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stderr is not None
        said = [watch.stderr.readline() for _ in range(3)]
        line = next((ln for ln in said if "your own script" in ln), "")
        assert "unmodified: " in line and "[ARGS]" in line, said
        command = line.split("unmodified: ", 1)[1].strip()
        command = command.replace("--nproc-per-node N", "--nproc-per-node 2").replace(
            "train.py [ARGS]", f"{script} 12 no-eval"
        )
        job = subprocess.run(
            ["bash", "-c", command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert job.returncode == 0, (command, job.stderr[-3000:])
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
        watch.wait()
        shutil.rmtree(root, ignore_errors=True)
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln[:2] in ("0 ", "1 ")}
    header = next(ln.split() for ln in out.splitlines() if ln.startswith("rank "))
    assert sorted(rows) == ["0", "1"], out + err
    for cols in rows.values():
        assert int(cols[header.index("count")]) >= 12, out  # every step's all_reduce at least
