"""Each line a rank prints goes out in one write, as a terminal's line buffering gives it.

`commtop run` starts the job with PYTHONUNBUFFERED=1, so its lines reach the TUI as they are
printed; but unbuffered, ``print(text)`` is two writes (the text, then the newline), and two
processes sharing one stdout (``mp.spawn``'s ranks) or two threads of one interleave between
them: "step 6 sum 32768step 6 sum 32768" and an empty line. Line buffering keeps the liveness
(a line is written when it ends; a flush, as progress bars do, writes what is pending) and
writes each line whole.
"""

from __future__ import annotations

import contextlib
import io
import sys


def whole_lines() -> None:
    """Line-buffer this process's stdout and stderr where they write through unbuffered."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.write_through:
            with contextlib.suppress(Exception):  # a stream the job replaced, or one closed
                stream.reconfigure(line_buffering=True, write_through=False)
