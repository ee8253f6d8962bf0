"""What a monitored job (workers.monitor) can be asked to change: only the knobs it declared
(its Hello lists them), and ``mode`` when one of them is its mode knob. The synthetic loop's
settings (copies, copy size, pinned, direction) mean nothing to a user's script: a request
for them is refused with a message instead of waiting "not yet in force" for ever."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Settings only commtop's own loop has (the TUI keys c/C, s, h, d).
LOOP_ONLY = ("copies", "copy_scale", "pinned", "direction")


def describe_knobs(knobs: Mapping[str, tuple[str, ...]]) -> str:
    """ "offload (none/overlap/sync)"; "none" for a job without knobs."""
    return ", ".join(f"{k} ({'/'.join(v)})" for k, v in knobs.items()) or "none"


def refusal(changes: Mapping[str, Any], knobs: Mapping[str, tuple[str, ...]], mode_knob: str, job: str = "") -> str:
    """ "" when the job honours every change, else the one-line reason."""
    who = job or "this job"
    for key, value in changes.items():
        if key == "mode":
            if not mode_knob:
                return f"{who} has no offload-mode knob (its knobs: {describe_knobs(knobs)})"
            if value not in knobs.get(mode_knob, ()):
                return f"{who}'s {mode_knob} knob takes {'/'.join(knobs[mode_knob])}, not {value}"
        elif key in LOOP_ONLY:
            return f"{who} has no knob for {key.replace('_', ' ')} (its knobs: {describe_knobs(knobs)})"
    return ""  # unknown knobs are refused by Settings.updated, with the same words as for ctl
