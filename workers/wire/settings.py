"""Live settings: what the TUI and `commtop ctl` may change while a run goes on.

Only the fields of :class:`Settings` can be changed, each with a validated value
(an allow-list): anything else is refused with a one-line reason and changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from workers.wire.protocol import DIRECTIONS, MODES

MAX_COPIES = 16
COPY_SCALES: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
MAX_KNOBS = 32
#: Longest injected straggler delay (ms) and where it can run (workers.synthetic.delay).
MAX_DELAY_MS = 10_000.0
DELAY_ON: tuple[str, ...] = ("host", "gpu")


class SettingsError(ValueError):
    """A requested setting is unknown or out of range."""


@dataclass(frozen=True)
class Settings:
    mode: str = "overlap"  # one of MODES
    copies: int = 5  # copies per step, 0..MAX_COPIES
    copy_scale: float = 1.0  # copy size as a multiple of the collective tensor, one of COPY_SCALES
    pinned: bool = True  # pinned (True) or pageable host memory
    direction: str = "d2h"  # one of DIRECTIONS
    knobs: dict[str, str] = field(default_factory=dict)  # user-declared knobs (workers.monitor)
    #: A straggler on demand: rank ``delay_rank`` (-1: every rank r, r/(n-1) of it) waits
    #: ``delay_ms`` before each collective, on the host or on the GPU (``delay_on``).
    delay_ms: float = 0.0
    delay_rank: int = 0
    delay_on: str = "host"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def updated(
        self, changes: Mapping[str, Any], knob_choices: Mapping[str, tuple[str, ...]] | None = None
    ) -> Settings:
        """A copy with ``changes`` applied, each validated; raises SettingsError."""
        values: dict[str, Any] = {}
        knobs = dict(self.knobs)
        for name, raw in changes.items():
            if name == "mode":
                values["mode"] = _choice(name, raw, MODES)
            elif name == "copies":
                values["copies"] = _int_in(name, raw, 0, MAX_COPIES)
            elif name == "copy_scale":
                values["copy_scale"] = _scale(raw)
            elif name == "pinned":
                values["pinned"] = _bool(name, raw)
            elif name == "direction":
                values["direction"] = _choice(name, raw, DIRECTIONS)
            elif name == "delay_ms":
                values["delay_ms"] = _float_in(name, raw, 0.0, MAX_DELAY_MS)
            elif name == "delay_rank":
                values["delay_rank"] = _int_in(name, raw, -1, 1 << 20)
            elif name == "delay_on":
                values["delay_on"] = _choice(name, raw, DELAY_ON)
            elif name == "knobs":
                if not isinstance(raw, Mapping):
                    raise SettingsError("knobs must be a map of name -> value")
                for knob, value in raw.items():
                    knobs[str(knob)] = _knob(str(knob), value, knob_choices)
            elif (knob := knob_name(name, knob_choices)) is not None:
                knobs[knob] = _knob(knob, raw, knob_choices)
            else:
                allowed = "mode, copies, copy_scale, pinned, direction, delay_ms, delay_rank, delay_on" + (
                    ", " + ", ".join(sorted(knob_choices)) if knob_choices else ""
                )
                raise SettingsError(f"unknown setting {name!r} (allowed: {allowed})")
        if len(knobs) > MAX_KNOBS:
            raise SettingsError(f"at most {MAX_KNOBS} knobs")
        return replace(self, knobs=knobs, **values)


def knob_name(setting: str, knob_choices: Mapping[str, tuple[str, ...]] | None = None) -> str | None:
    """The knob a setting's name addresses: ``knob.X`` (``commtop ctl set knob.X=...``) or a
    bare declared knob name ``X`` -> ``"X"``; None for a name that is not a knob's. A name of
    a Settings field is never a knob's: check those first (as :meth:`Settings.updated` does)."""
    if setting.startswith("knob."):
        return setting.removeprefix("knob.")
    if knob_choices and setting in knob_choices:
        return setting
    return None


#: The fields a peer may send; anything else in a wire dict is ignored.
FIELDS = ("mode", "copies", "copy_scale", "pinned", "direction", "knobs", "delay_ms", "delay_rank", "delay_on")
#: Longest knob name or value a peer may report.
MAX_KNOB_TEXT = 64


def settings_from_wire(data: Any, knob_choices: Mapping[str, tuple[str, ...]] | None = None) -> Settings:
    """The one conversion of settings sent by a peer (a control message, a Hello, a store
    proposal) into :class:`Settings`; every field is validated like a change, and names
    outside :data:`FIELDS` are ignored. Raises SettingsError.

    With ``knob_choices`` (a worker, which declared its knobs) each knob must be one of its
    choices. Without (the collector, which only hears knobs from Hellos) knobs are kept as
    reported, within :data:`MAX_KNOBS` names of at most :data:`MAX_KNOB_TEXT` characters.
    """
    if not isinstance(data, Mapping):
        raise SettingsError("settings must be a map")
    base = Settings().updated({k: v for k, v in data.items() if k in FIELDS and k != "knobs"})
    knobs = data.get("knobs") or {}
    if not isinstance(knobs, Mapping):
        raise SettingsError("knobs must be a map of name -> value")
    if knob_choices is not None:
        return base.updated({"knobs": knobs}, knob_choices)
    if len(knobs) > MAX_KNOBS:
        raise SettingsError(f"at most {MAX_KNOBS} knobs")
    reported = {str(k): str(v) for k, v in knobs.items()}
    if any(len(k) > MAX_KNOB_TEXT or len(v) > MAX_KNOB_TEXT for k, v in reported.items()):
        raise SettingsError(f"knob names and values are at most {MAX_KNOB_TEXT} characters")
    return replace(base, knobs=reported)


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse ``name=value`` from the command line (``copies=3``, ``pinned=false``)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SettingsError(f"expected name=value, got {text!r}")
    return name.strip(), value.strip()


def _choice(name: str, raw: Any, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}; got {raw!r}")
    return str(raw)


def _int_in(name: str, raw: Any, lo: int, hi: int) -> int:
    try:
        value = int(raw)
        if isinstance(raw, float) and raw != value:
            raise ValueError
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be an integer in {lo}..{hi}; got {raw!r}") from None
    if isinstance(raw, bool) or not lo <= value <= hi:
        raise SettingsError(f"{name} must be an integer in {lo}..{hi}; got {raw!r}")
    return value


def _float_in(name: str, raw: Any, lo: float, hi: float) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(raw, bool) or not lo <= value <= hi:
        raise SettingsError(f"{name} must be a number in {lo:g}..{hi:g}; got {raw!r}")
    return value


def _scale(raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(raw, bool) or value not in COPY_SCALES:
        raise SettingsError(f"copy_scale must be one of {', '.join(map(str, COPY_SCALES))}; got {raw!r}")
    return value


def _bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false; got {raw!r}")


def _knob(name: str, raw: Any, knob_choices: Mapping[str, tuple[str, ...]] | None) -> str:
    if knob_choices is None or name not in knob_choices:
        raise SettingsError(f"unknown knob {name!r}")
    return _choice(name, str(raw), knob_choices[name])
