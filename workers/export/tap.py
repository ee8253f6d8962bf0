"""Where a node's ranks push a copy of their record batches for the node's exporter.

An ``ipc://`` socket in this user's private runtime directory (0700), one per run and node
(hashed, so several "nodes" on one machine and long host names stay apart and short).
Torch-free and zmq-free: ranks and the node sampler both import it.
"""

from __future__ import annotations

import hashlib

from workers.wire.connection import runtime_root
from workers.wire.exporter_address import TAP_FILE

#: Seconds the exporter keeps serving after its node's ranks exited (final scrape of a short job).
LINGER_ENV = "COMMTOP_PROMETHEUS_LINGER_S"


def tap_endpoint(session: str, host: str) -> str:
    digest = hashlib.sha256(f"{session}|{host}".encode()).hexdigest()[:16]
    return f"ipc://{runtime_root() / TAP_FILE.format(digest=digest)}"
