"""A monitored job's live knobs (``mon.knob``) and the agreement that changes them.

:class:`Knobs` holds what the job declared, the values in force and the mode knob (the
first knob whose choices are offload modes: its value fills the records' ``mode`` column and
the TUI's mode key switches it). :func:`live_control` builds the settings agreement through
torchrun's store (``workers.rank.live_control``), so every rank switches at the same step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import zmq

from workers.rank.control import Control
from workers.wire.connection import Connection
from workers.wire.protocol import MODES
from workers.wire.settings import MAX_KNOBS, Settings

MAX_NAME = 64
MAX_CHOICES = 16


class Knobs:
    """Declared knobs, their values in force, and the mode knob."""

    def __init__(self) -> None:
        self.choices: dict[str, tuple[str, ...]] = {}  # declared knobs (read by rank 0's listener)
        self.values: dict[str, str] = {}  # knob values in force
        self.mode_knob = ""  # the knob whose value fills the records' mode column
        #: A step has ended: the job has declared its knobs (before its loop), so a job with none
        #: has none (the collector then refuses every change instead of waiting for them).
        self.final = False

    @property
    def mode(self) -> int:
        """The records' mode (index into MODES): the mode knob's value, "none" without one."""
        return MODES.index(self.values[self.mode_knob]) if self.mode_knob else 0

    def declare(self, name: str, choices: Sequence[str], default: str | None) -> tuple[str, bool]:
        """(value, newly declared) of a knob; raises ValueError for a bad declaration. The
        first knob whose choices are all MODES becomes the mode knob."""
        values = tuple(str(c) for c in choices)
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or name.startswith("knob."):
            raise ValueError(f"knob name must be 1..{MAX_NAME} characters; got {name!r}")
        if not 0 < len(values) <= MAX_CHOICES or len(set(values)) != len(values):
            raise ValueError(f"knob {name!r} needs 1..{MAX_CHOICES} distinct choices; got {values!r}")
        if name in self.choices:
            return self.values[name], False
        if len(self.choices) >= MAX_KNOBS:
            raise ValueError(f"at most {MAX_KNOBS} knobs")
        value = values[0] if default is None else str(default)
        if value not in values:
            raise ValueError(f"default {default!r} of knob {name!r} is not one of {values!r}")
        self.choices[name] = values
        self.values[name] = value
        if not self.mode_knob and set(values) <= set(MODES):
            self.mode_knob = name
        return value, True

    def settings(self) -> Settings:
        """The knobs in force as Settings (what the Hellos report)."""
        return Settings(mode=MODES[self.mode], copies=0, knobs=dict(self.values))

    def apply(self, prev: Settings, settings: Settings) -> None:
        """Settings agreed for a step (``prev``: the ones agreed before): changed knobs take
        their new value. A changed ``mode`` (the TUI's mode key) moves the mode knob when that
        knob itself did not change."""
        values = dict(self.values)
        changed = set()
        for name, value in settings.knobs.items():
            if name in self.choices and value in self.choices[name] and value != prev.knobs.get(name):
                values[name] = value
                changed.add(name)
        mk = self.mode_knob
        if mk and mk not in changed and settings.mode != prev.mode and settings.mode in self.choices[mk]:
            values[mk] = settings.mode
        self.values = values


def live_control(
    conn: Connection,
    *,
    rank: int,
    world_size: int,
    initial: Settings,
    knob_choices: Mapping[str, tuple[str, ...]],
    context: zmq.Context[Any],
) -> Control:
    """The settings agreement of a monitored job, one epoch per ``step()``; rank 0 also listens
    for the collector's desired settings (checked against ``knob_choices``)."""
    from workers.rank.live_control import DesiredListener, LiveControl, connect_store, store_prefix

    if world_size == 1:
        from torch.distributed import HashStore

        store: Any = HashStore()
    else:
        store = connect_store()
    desired = None
    if rank == 0:
        desired = DesiredListener(conn.control, conn.key, conn.session, knob_choices=knob_choices, context=context)
        desired.note_in_force(0, initial)
    return LiveControl(
        store,
        rank=rank,
        world_size=world_size,
        settings=initial,
        prefix=store_prefix(conn.session) + "/monitor",
        step=1,
        desired=desired,
    )
