"""Which settings are in force, and which change is pending: one rule for the whole viewer.

The run model (hence the header, the headless summary and snapshots) and the control server
(hence ``commtop ctl status`` and the refusal of changes while one is pending) read the same
:class:`InForceTracker`, fed once per message, so they cannot disagree.

The rule: the *lead* rank (rank 0, else the lowest rank that said Hello) names the epoch in
force (its newest batch header, else its Hello). That epoch's settings are those the workers
reported for it in a Hello or, until a Hello says so (once a second), those the collector
published for it; the mode is that of the lead's newest collective record, which changes at
an iteration. A change is pending while any rank reports a pending epoch newer than that.

Settings arrive as wire dicts (Hello, a replay's recording) and are decoded here, once, into
:class:`~workers.wire.settings.Settings`; the snapshot, the header and ``ctl status`` read them typed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from workers.wire.control import EPOCH_HISTORY
from workers.wire.protocol import COLL, MODES, Batch, Bye, Hello
from workers.wire.settings import Settings, SettingsError, settings_from_wire


@dataclass(frozen=True)
class InForce:
    """The settings in force, their epoch, and the pending change if any."""

    #: The settings in force, their mode that of the lead's newest record (None: no Hello,
    #: recording or collector said them yet).
    settings: Settings | None = None
    #: The mode in force: of the lead's newest record, else of ``settings`` ("": unknown). Known
    #: from the records before the other settings are.
    mode: str = ""
    epoch: int = -1
    pending_epoch: int = -1
    apply_at: int = -1
    #: What the pending epoch brings, when known (None: no Hello / recording / collector said yet).
    pending_settings: Settings | None = None

    def wire(self) -> dict[str, Any]:
        """The settings in force as a wire dict (``ctl status``)."""
        return settings_wire(self.settings, self.mode)


def settings_wire(settings: Settings | None, mode: str = "") -> dict[str, Any]:
    """Settings in force as a wire dict: all of them when known, else only the mode when that
    is known (from the records), else none."""
    if settings is not None:
        return settings.as_dict()
    return {"mode": mode} if mode else {}


def reported_settings(data: object) -> Settings | None:
    """Settings as a Hello or a recording reports them (knobs as reported); None when there are
    none or they are malformed."""
    if not data:
        return None
    try:
        return settings_from_wire(data)
    except SettingsError:
        return None


@dataclass
class _RankControl:
    hello: Hello | None = None
    settings: Settings | None = None  # its Hello's, decoded
    header: tuple[int, int, int] = (-1, -1, -1)  # epoch in force, pending epoch, apply_at
    header_t_ns: int = -1
    mode: int = -1  # mode of the newest collective record


class InForceTracker:
    """Fed with every accepted message (``note``); ``state()`` from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: dict[int, _RankControl] = {}
        self._by_epoch: dict[int, Settings] = {}
        #: Settings per epoch known beforehand (a replay's whole recording); kept across reset().
        self._known: dict[int, Settings] = {}

    def learn(self, settings: Mapping[int, Mapping[str, Any]]) -> None:
        """Every epoch's settings at once, as the recording's hellos report them (a replay reads
        them), so a jump shows the settings of the epoch it lands in before that epoch's first Hello."""
        decoded = ((int(e), reported_settings(v)) for e, v in list(settings.items())[-EPOCH_HISTORY:])
        with self._lock:
            self._known = {e: v for e, v in decoded if v is not None}

    def note_settings(self, epoch: int, settings: Settings) -> None:
        """The settings of ``epoch`` (the collector published them)."""
        with self._lock:
            self._remember(epoch, settings)

    def _remember(self, epoch: int, settings: Settings) -> None:
        self._by_epoch[epoch] = settings
        if len(self._by_epoch) > EPOCH_HISTORY:
            del self._by_epoch[min(self._by_epoch)]

    def settings_of(self, epoch: int) -> Settings | None:
        """The settings of ``epoch`` as the workers, the collector or the recording said them."""
        with self._lock:
            return self._by_epoch.get(epoch) or self._known.get(epoch)

    def note(self, message: object) -> None:
        if isinstance(message, Batch):
            with self._lock:
                rank = self._ranks.setdefault(message.rank, _RankControl())
                if message.t_ns >= rank.header_t_ns:
                    rank.header = (message.epoch_in_force, message.pending_epoch, message.apply_at)
                    rank.header_t_ns = message.t_ns
                    if message.kind == COLL and len(message):
                        rank.mode = int(message.columns["mode"][-1])
        elif isinstance(message, Hello):
            with self._lock:
                rank = self._ranks.setdefault(message.rank, _RankControl())
                last = rank.hello
                # a rank repeats its settings in every Hello (once a second): parsed once
                same = last is not None and last.settings == message.settings
                settings = rank.settings if same else reported_settings(message.settings)
                rank.hello, rank.settings = message, settings
                if settings is not None:
                    self._remember(message.epoch, settings)
        elif isinstance(message, Bye):
            with self._lock:
                gone = self._ranks.get(message.rank)
                if gone is not None:  # an exited rank no longer holds a change pending
                    gone.header = (gone.header[0], -1, -1)

    def reset(self) -> None:
        with self._lock:
            self._ranks.clear()
            self._by_epoch.clear()

    def state(self) -> InForce:
        with self._lock:
            lead = self._lead()
            if lead is None:
                return InForce()
            epoch = lead.header[0] if lead.header_t_ns >= 0 else (lead.hello.epoch if lead.hello else -1)
            settings = self._by_epoch.get(epoch) or self._known.get(epoch) or lead.settings
            mode = MODES[lead.mode] if 0 <= lead.mode < len(MODES) else ""
            if settings is not None and mode:
                settings = replace(settings, mode=mode)
            pending = [(r.header[1], r.header[2]) for r in self._ranks.values() if r.header[1] > epoch]
            pending_epoch, apply_at = max(pending) if pending else (-1, -1)
            target = self._by_epoch.get(pending_epoch) or self._known.get(pending_epoch)
        return InForce(
            settings=settings,
            mode=mode or (settings.mode if settings is not None else ""),
            epoch=epoch,
            pending_epoch=pending_epoch,
            apply_at=apply_at,
            pending_settings=target,
        )

    def _lead(self) -> _RankControl | None:
        with_hello = sorted(r for r, s in self._ranks.items() if s.hello is not None)
        if with_hello:
            return self._ranks[with_hello[0]]
        return self._ranks[min(self._ranks)] if self._ranks else None
