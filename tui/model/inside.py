"""Where a stalled rank is: the blocking collective its job is inside (the Hello's ``inside``).

A hung job has ranks inside a collective a peer never joins and the peer elsewhere (its own
code, a sleep, another collective): telling them apart names the rank to look at.
"""

from __future__ import annotations

from tui.model.streams import group_label
from workers.wire.protocol import OP_NAMES, Hello

#: (op, group label, bytes, seconds inside it as of the rank's last Hello)
Inside = tuple[str, str, int, float]


def inside_of(hello: Hello | None) -> Inside | tuple[()]:
    """The collective ``hello`` says its rank is inside, () when none (or its capture cannot tell:
    the Flight Recorder's)."""
    if hello is None or not hello.inside:
        return ()
    op, code, nbytes, _since_ns = hello.inside
    name = OP_NAMES[op] if op < len(OP_NAMES) else f"op {op}"
    groups = hello.groups
    group = group_label(*groups[code][:2]) if code < len(groups) else str(code)
    return name, group, nbytes, hello.inside_s
