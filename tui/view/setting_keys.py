"""The setting keys (``o 1-4 c C s h d``) and ``a`` as this run allows them: the view's side of
tui.model.changeable, so the footer, the help screen, the command palette and a refused key
all say the same thing. No Textual here: the app asks, this module answers."""

from __future__ import annotations

import time
from collections.abc import Mapping

from tui.experiment.ab_experiment import refused_arm
from tui.model.changeable import KNOBS, UNKNOWN, Changeable
from tui.view.keys import KEYS
from workers.wire.protocol import MODES
from workers.wire.settings import Settings

#: The setting each key's action changes.
KEY_SETTINGS: dict[str, str] = {
    "cycle_mode": "mode",
    "pick_mode": "mode",
    "copies": "copies",
    "cycle_scale": "copy_scale",
    "toggle_pinned": "pinned",
    "toggle_direction": "direction",
}
AB = "ab"
#: How long a refused change's reason stays in the status line.
REFUSED_S = 8.0


def refusal(action: str, parameters: tuple[object, ...], can: Changeable) -> str:
    """ "" when the key's action can work in this run, else why not (one line). Before the
    workers said what they can change, every key is allowed (the control server says why not)."""
    name = action.partition("(")[0]
    if can.kind == UNKNOWN or (name not in KEY_SETTINGS and name != AB):
        return ""
    if name == AB:
        return "" if can.names() else can.why_not("mode")
    value = None
    if name == "pick_mode" and parameters and isinstance(parameters[0], int) and 0 <= parameters[0] < len(MODES):
        value = MODES[parameters[0]]
    return can.why_not(KEY_SETTINGS[name], value)


def parameters(action: str) -> tuple[object, ...]:
    """``pick_mode(3)`` -> (3,): the literal parameters of a key's action."""
    inside = action.partition("(")[2].rstrip(")")
    return tuple(int(p) if p.strip().lstrip("-").isdigit() else p.strip() for p in inside.split(",") if p.strip())


def _action_of(key: str) -> str:
    """The action a key is bound to (with its parameters: ``pick_mode(3)``), "" for none."""
    return next((k.action for k in KEYS if key in k.keys.split(",")), "")


def key_refusal(key: str, can: Changeable) -> str:
    """Why a pressed key that this run does not offer does nothing ("" for any other key)."""
    action = _action_of(key)
    return refusal(action, parameters(action), can) if action else ""


def replay_refusal(key: str, job_log: bool) -> str:
    """Why a setting key, ``a`` or ``l`` (without a job's log: ``job_log`` False) does nothing
    in a session without a controller (a replay); "" for any other key."""
    name = _action_of(key).partition("(")[0]
    if name in KEY_SETTINGS or name == AB:
        return "a recording plays as it was recorded: nothing to change"
    if name == "job_log" and not job_log:
        return "no job's output here: commtop run keeps its job's (beside a recording: NAME.log)"
    return ""


def help_line(can: Changeable, controller: object) -> str:
    """What the help screen says this run can change ("" without a controller, or before the
    workers said)."""
    return can.describe() if controller is not None and can.kind != UNKNOWN else ""


def arms_refusal(can: Changeable, a: Mapping[str, str], b: Mapping[str, str]) -> str:
    """The A/B dialog's arms checked before a block starts ("" when both can be set, or when
    the run has not said yet: the experiment checks them at its start then)."""
    return refused_arm(can.check, a, b) if can.known else ""


class RefusedLine:
    """A refused change's reason, in the status line for REFUSED_S after the key."""

    def __init__(self) -> None:
        self.why, self.until = "", 0.0

    def set(self, why: str) -> None:
        self.why, self.until = why, time.monotonic() + REFUSED_S

    def lines(self) -> list[str]:
        return [self.why] if self.why and time.monotonic() < self.until else []


def next_mode(current: str, can: Changeable) -> str:
    """The mode after ``current`` among those this run takes (a job's mode knob may take fewer)."""
    modes = can.modes() or MODES
    return modes[(modes.index(current) + 1) % len(modes)] if current in modes else modes[0]


def default_arms(can: Changeable, current: Settings | None) -> tuple[str, str]:
    """The A/B dialog's first guess: mode none against the mode in force (or the next one); for a
    job without a mode knob, its first knob's first choice against its value in force."""
    modes = can.modes() or (MODES if can.kind != KNOBS else ())
    if len(modes) > 1 and "none" in modes:
        mode = current.mode if current is not None else "overlap"
        b = mode if mode != "none" and mode in modes else next(m for m in modes if m != "none")
        return "mode=none", f"mode={b}"
    if can.knobs:
        knob, choices = next(iter(can.knobs.items()))
        value = current.knobs.get(knob, choices[0]) if current is not None else choices[0]
        other = value if value != choices[0] else (choices[1] if len(choices) > 1 else choices[0])
        return f"knob.{knob}={choices[0]}", f"knob.{knob}={other}"
    return "mode=none", "mode=overlap"
