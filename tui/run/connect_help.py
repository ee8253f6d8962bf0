"""How to point workers at a `commtop watch`: the lines the CLI prints and the TUI shows.

One owner for the text, so the terminal (before the TUI takes the screen, and after it
quits) and the TUI's connect panel say the same thing.
"""

from __future__ import annotations

import socket

from workers.wire.connection import Connection


def connect_lines(conn: Connection, listen: str | None = None) -> list[str]:
    """The connection file, the torchrun line for commtop's workers, and the line for a user's
    own script, unmodified: torchrun starts it through the capture bootstrap (as `commtop run
    -- python train.py` does), which reads its collectives and copies (a script that uses
    ``workers.monitor`` runs the same way)."""
    other = (
        f"   (other nodes: --connect tcp://{socket.gethostname()}:{conn.data.rsplit(':', 1)[-1]} "
        "--connection-file <copy of that file>)"
        if listen
        else ""
    )
    return [
        f"connection file {conn.path}",
        f"start workers with: torchrun --nproc-per-node N -m workers --connection-file {conn.path}{other}",
        f"or your own script, unmodified: COMMTOP_CONNECTION_FILE={conn.path} torchrun {'' if listen else '--standalone '}"
        "--nproc-per-node N -m workers.capture.bootstrap train.py [ARGS]",
    ]
