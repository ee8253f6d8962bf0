"""Which rank failed first, and the lines that say so; what headless passes through. Frozen
text: torchrun 2.13's and gloo's real output from a 2-rank run where rank 1 raised and rank 0
died of the broken all_reduce before torchrun's next poll (pids and paths as printed)."""

from __future__ import annotations

import io

from tui.model.run_model import RunModel
from tui.run.headless_out import PROGRESS_EVERY_S, HeadlessTerminal, Progress
from tui.run.job_failure import RankOutput, exception_line, explain, last_traceback, torchrun_lines
from tui.run.job_output import MAX_LINE, JobLine, split_lines

#: torchrun's own stderr: both ranks exited 1 within one poll; its "Root Cause" names rank 0.
TORCHRUN = """\
E1204 06:58:57.647000 24837 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 24895) of binary: /venv/bin/python
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
boom.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_06:58:57
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 24896)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_06:58:57
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 24895)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
""".splitlines()
RANK1_ERR = [
    "Traceback (most recent call last):",
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    '  File "/repo/workers/capture/bootstrap.py", line 253, in main',
    '    runpy.run_path(target, run_name="__main__")',
    '  File "/tmp/boom.py", line 11, in <module>',
    '    raise ValueError("boom on rank 1")',
    "ValueError: boom on rank 1",
]
RANK0_ERR = [
    "Traceback (most recent call last):",
    '  File "/tmp/boom.py", line 12, in <module>',
    "    dist.all_reduce(t)",
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
    "peer [127.0.0.1]:25253. This is typically caused by a remote worker crashing.",
]


def test_the_first_failing_rank_is_the_one_whose_error_is_its_own_not_torchruns_root_cause() -> None:
    words = torchrun_lines(TORCHRUN)
    # Both tracebacks were read in the same pass, rank 0's first (the race torchrun loses too).
    outputs = {0: RankOutput(0, RANK0_ERR, traceback_seen=3), 1: RankOutput(1, RANK1_ERR, traceback_seen=3)}
    failure = explain(1, words.exits, outputs, {}, TORCHRUN)
    assert failure.first == 1
    assert failure.lines == [
        "rank 0: exit code 1 after rank 1 failed; its error: RuntimeError: Connection closed by peer [127.0.0.1]:25253. "
        "This is typically caused by a remote worker crashing.",
        "rank 1 failed first (exit code 1):",
        "  [rank1]: Traceback (most recent call last):",  # commtop's frames (bootstrap, runpy) left out
        '  [rank1]:   File "/tmp/boom.py", line 11, in <module>',
        '  [rank1]:     raise ValueError("boom on rank 1")',
        "  [rank1]: ValueError: boom on rank 1",
    ]


def test_two_ranks_failing_on_their_own_are_ordered_by_their_byes() -> None:
    words = torchrun_lines(TORCHRUN)
    err = ["Traceback (most recent call last):", "ValueError: mine"]
    outputs = {0: RankOutput(0, err, traceback_seen=3), 1: RankOutput(1, err, traceback_seen=3)}
    byes = {0: (2_000, "ValueError: mine"), 1: (1_000, "ValueError: mine")}
    assert explain(1, words.exits, outputs, byes, TORCHRUN).first == 1
    assert explain(1, words.exits, outputs, {}, TORCHRUN).first == 0  # nothing else to go by: the lower rank


def test_without_any_rank_failing_torchruns_last_lines_are_said() -> None:
    lines = ["torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address."]
    failure = explain(1, {}, {}, {}, lines)
    assert failure.first is None and failure.lines[-1].strip() == lines[0]


def test_a_rank_that_exits_without_a_traceback_is_not_explained_by_commtops_own_notice() -> None:
    """The sweep: every rank ran sys.exit(3); the failure named commtop's capture notice as rank
    0's error. A rank's error is its own lines, and with none, how it ended."""
    notice = "commtop: gloo: no Flight Recorder timing; timing each collective call with Python hooks"
    torchrun = ["E1205 failed (exitcode: 3) local_rank: 0 (pid: 101) of binary: /venv/bin/python"]
    exits = torchrun_lines(torchrun).exits
    outputs = {0: RankOutput(0, [notice], traceback_seen=None)}
    failure = explain(3, exits, outputs, {}, torchrun)
    assert failure.first == 0
    assert failure.lines == ["rank 0 failed first: exit code 3"]
    outputs[0] = RankOutput(0, [notice, "giving up: no data"], traceback_seen=None)
    assert explain(3, exits, outputs, {}, torchrun).lines == [
        "rank 0 failed first (exit code 3):",
        "  [rank0]: giving up: no data",
    ]


def _terminal(progress: bool = False) -> tuple[HeadlessTerminal, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return HeadlessTerminal(out, err, progress=progress), out, err


def test_headless_passes_ranks_lines_to_their_stream_and_leaves_out_torchruns_wrapper() -> None:
    term, out, err = _terminal()
    term.line(JobLine(0, False, "step 1"))
    term.line(JobLine(1, True, "a warning"))
    for text in TORCHRUN:
        term.line(JobLine(None, True, text))
    term.line(JobLine(None, True, "after the summary"))
    term.close()
    assert out.getvalue() == "[rank0]: step 1\n"
    assert err.getvalue().splitlines() == ["[rank1]: a warning", TORCHRUN[0], "after the summary"]


def test_torchruns_traceback_of_the_sigterm_that_stops_the_job_is_left_out() -> None:
    """torchrun 2.13's own lines when commtop stops the job (frozen, frames shortened): its
    warnings pass, its SignalException traceback (30 lines) stays in the log only."""
    lines = [
        "W1205 01:42:49.166000 30000 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, "
        "shutting down workers",
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in '
        "_invoke_run",
        "    time.sleep(monitor_interval)",
        "           ^^^^^^^^^^^^^",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in '
        "_terminate_process_handler",
        '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 30000 got signal: 15",
    ]
    term, _out, err = _terminal()
    for text in [*lines, "after it"]:
        term.line(JobLine(None, True, text))
    assert err.getvalue().splitlines() == [lines[0], "after it"]


def test_another_torchrun_traceback_is_passed_through() -> None:
    term, _out, err = _terminal()
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "OSError: address in use"]
    for text in lines:
        term.line(JobLine(None, True, text))
    assert err.getvalue().splitlines() == lines


def test_the_progress_line_is_cleared_before_a_job_line_and_drawn_again_after() -> None:
    term, out, err = _terminal(progress=True)
    term.progress("commtop: step 3")
    term.line(JobLine(0, True, "hello"))
    term.close()
    assert err.getvalue() == "\r\x1b[Kcommtop: step 3\r\x1b[K[rank0]: hello\ncommtop: step 3\r\x1b[K"
    assert out.getvalue() == ""


def test_the_progress_line_comes_at_most_twice_a_second() -> None:
    progress = Progress(RunModel(), expected_ranks=2, started=0.0)
    ticks = [i * 0.1 for i in range(50)]  # 5 s, polled every 0.1 s
    assert sum(progress.due(t) for t in ticks) <= 5 / PROGRESS_EVERY_S + 1
    assert progress.text(ticks[-1]) == "commtop: starting · ranks 0/2 · 0:04"


def test_for_commtops_own_loop_only_the_ranks_stderr_is_passed() -> None:
    out, err = io.StringIO(), io.StringIO()
    term = HeadlessTerminal(out, err, progress=False, ranks_stdout=False)
    term.line(JobLine(0, False, 'commtop-summary {"rank": 0}'))  # the loop's machine-readable summary
    term.line(JobLine(0, True, "commtop worker rank 0: a warning"))
    assert (out.getvalue(), err.getvalue()) == ("", "[rank0]: commtop worker rank 0: a warning\n")


def test_a_rank_row_ended_by_a_signal_says_the_signal_not_exited() -> None:
    from tui.model.snapshot import RankView
    from tui.view.widgets.rank_rows import state_note

    why = "killed by SIGTERM (stopped by torchrun after rank 1 failed)"
    assert state_note(RankView(rank=0, state="exited", exit_code=-15, exit_reason=why), None) == f" {why} "
    own = RankView(rank=1, state="exited", exit_code=1, exit_reason="ValueError: boom on rank 1")
    assert state_note(own, None) == " exited (1): ValueError: boom on rank 1 "


def test_a_rank_torchrun_stops_after_its_own_error_is_explained_by_that_error() -> None:
    """torchrun sends SIGTERM to the ranks still running once one failed; a rank that had
    already failed by itself (the peer's broken all_reduce) was said to be "stopped by torchrun",
    which hid its own error (QA: a 2-rank job whose rank 1 raised)."""
    lines = [
        "W1207 14:44:35.337000 1152 api.py:1028] Sending process 1157 closing signal SIGTERM",
        "E1207 14:44:35.702000 1152 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 1158) of binary: python",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : 1 (pid: 1157)",
        "[1]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 1158)",
    ]
    words = torchrun_lines(lines)
    assert words.exits[0].stopped
    byes = {1: (1_000, "ValueError: boom on rank 1"), 0: (2_000, "RuntimeError: Connection closed by peer")}
    outputs = {0: RankOutput(0, RANK0_ERR, traceback_seen=3), 1: RankOutput(1, RANK1_ERR, traceback_seen=3)}
    failure = explain(1, words.exits, outputs, byes, lines)
    assert failure.first == 1
    assert failure.lines[0].startswith(
        "rank 0: exit code 1 after rank 1 failed; its error: RuntimeError: Connection closed"
    )
    quiet = {1: outputs[1]}  # a rank that had no error of its own: torchrun stopped it
    assert explain(1, words.exits, quiet, {1: byes[1]}, lines).lines[0] == (
        "rank 0: exit code 1 (stopped by torchrun after rank 1 failed)"
    )


def test_a_stopped_ranks_last_printed_line_is_not_its_error() -> None:
    """A rank torchrun stopped after another failed, with no traceback of its own: its last line
    (a framework's tip) was said as its error ("killed by SIGTERM: 💡 Tip: For seamless cloud
    logging ..."); it was only stopped."""
    lines = [
        "W1207 14:44:35.337000 1152 api.py:1028] Sending process 1157 closing signal SIGTERM",
        "E1207 14:44:35.702000 1152 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 1158) of binary: python",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : -15 (pid: 1157)",
        "[1]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 1158)",
    ]
    words = torchrun_lines(lines)
    tip = ["💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger"]
    assert exception_line(tip) == ""
    outputs = {0: RankOutput(0, tip), 1: RankOutput(1, RANK1_ERR, traceback_seen=3)}
    failure = explain(1, words.exits, outputs, {1: (1_000, "ValueError: boom on rank 1")}, lines)
    assert failure.lines[0] == "rank 0: killed by SIGTERM (stopped by torchrun after rank 1 failed)"


def test_commtops_end_lines_after_a_rank_s_traceback_are_not_its_error() -> None:
    """The monitor's lines at a rank's end come after the job's traceback in its stderr; the
    rank's error is the traceback's exception, not "commtop monitor: ... failed inside torch"."""
    err = [*RANK0_ERR, "commtop monitor: rank 0: 1 collective failed inside torch once issued (the last: ...)"]
    assert exception_line(err).startswith("RuntimeError: Connection closed by peer")
    assert all(not ln.startswith("commtop") for ln in last_traceback(err))


def test_a_stream_whose_reader_left_is_written_no_more_and_the_other_goes_on() -> None:
    """``commtop run --headless ... | head -3``: stdout's reader leaves; the ranks' stderr lines
    still come (before, the first BrokenPipeError stopped every line of the job)."""

    class FakeClosedPipe(io.StringIO):
        """A test fake of a pipe whose reader left."""

        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    out, err = FakeClosedPipe(), io.StringIO()
    term = HeadlessTerminal(out, err, progress=False)
    term.line(JobLine(0, False, "to stdout"))
    term.line(JobLine(0, True, "to stderr"))
    term.line(JobLine(1, False, "more stdout"))
    assert err.getvalue() == "[rank0]: to stderr\n"


def test_a_progress_bar_keeps_its_latest_state_and_long_lines_are_cut_between_characters() -> None:
    """tqdm rewrites one line with "\\r" until the bar ends: it was cut into 16 KiB fragments,
    some inside a "█" (3 bytes: shown as replacement marks); a 1 MB line's last piece was 2 MiB."""
    lines, partial = split_lines(b"step 1\n 10%|\xe2\x96\x88 \r 20%|\xe2\x96\x88\xe2\x96\x88 \r 30%|")
    assert lines == [b"step 1"] and partial == b" 30%|"
    assert split_lines(b"crlf\r") == ([], b"crlf\r")  # half of "\r\n": kept
    bar = ("█" * 20_000).encode()
    for data in (bar + b"\n", bar):
        pieces, rest = split_lines(data)
        assert all(len(p) <= MAX_LINE for p in [*pieces, rest])
        assert b"".join([*pieces, rest]).decode() == "█" * 20_000
        assert all(p.decode() for p in pieces)  # each piece whole characters


def test_a_rank_that_failed_on_its_own_error_is_not_said_to_fail_after_the_first() -> None:
    """Both ranks called init_process_group("glooo"): each failed on its own; the later one was
    said to fail "after rank 0 failed", as if the first had caused it (QA). A peer's failure
    seen through a collective still says after whom."""
    own = ["Traceback (most recent call last):", "AssertionError: Unknown backend type glooo"]
    outputs = {0: RankOutput(0, own, traceback_seen=1), 1: RankOutput(1, own, traceback_seen=2)}
    failure = explain(1, {}, outputs, {}, [])
    assert failure.first == 0 and failure.ended[1] == "failed: AssertionError: Unknown backend type glooo"
    peer = {0: RankOutput(0, RANK1_ERR, traceback_seen=1), 1: RankOutput(1, RANK0_ERR, traceback_seen=2)}
    assert (
        explain(1, {}, peer, {}, [])
        .ended[1]
        .startswith("failed after rank 0 failed; its error: RuntimeError: Connection")
    )


def test_a_long_error_is_cut_between_words_and_says_so() -> None:
    long = (
        "RuntimeError: Read error [127.0.0.1]:9132: Connection reset by peer. "
        + "Check the logs of the remote worker before reporting " * 4
    )
    err = ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>', long.strip()]
    said = exception_line(err)
    assert len(said) <= 200 and said.endswith("…") and said[:-1] == long[: len(said) - 1]
    assert long[len(said) - 1] == " "  # the cut fell between two words
