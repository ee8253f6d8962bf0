"""Bodies of the control channel's messages (signed with :func:`workers.wire.protocol.seal`).

The collector publishes the desired settings (CTL_STATE) to every rank; ``commtop ctl``
asks the collector (CTL_REQ) and gets a reply (CTL_REP). Both sides build their bodies
here, so a field has one name.
"""

from __future__ import annotations

import time
from typing import Any

from workers.wire import protocol
from workers.wire.settings import Settings

#: Settings epochs a collector remembers (to name the settings of a batch header's epoch).
EPOCH_HISTORY = 256


def ctl_state_body(session: str, epoch: int, settings: Settings) -> dict[str, Any]:
    """The desired-state message the collector publishes, re-sent every 0.5 s."""
    return {
        "v": protocol.SCHEMA_VERSION,
        "k": protocol.CTL_STATE,
        "s": session,
        "epoch": epoch,
        "settings": settings.as_dict(),
        "t": time.time_ns(),
    }


def ctl_request_body(session: str, op: str, nonce: str, **fields: Any) -> dict[str, Any]:
    """A ``commtop ctl`` request (``op`` = status / set); ``nonce`` pairs it with its reply."""
    body = {"v": protocol.SCHEMA_VERSION, "k": protocol.CTL_REQ, "s": session, "op": op}
    body.update(fields, nonce=nonce, t=time.time_ns())
    return body


def ctl_reply_body(session: str, nonce: str) -> dict[str, Any]:
    """The start of the collector's reply to a request with ``nonce``."""
    return {"v": protocol.SCHEMA_VERSION, "k": protocol.CTL_REP, "s": session, "nonce": nonce}
