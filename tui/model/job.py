"""What kind of job a run is, from its Hello's ``config``: commtop's synthetic loop, or a user's
script (captured unmodified, or using the monitor API). One rule for the header, the headless
summary and the report: the synthetic loop's settings (copies, size, pinned, direction), its
modes and the slowdown against mode none appear only where the job has them: the loop, or a
monitored job that declared a mode knob."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: What the monitor API writes before the script's name in ``config["collective"]``.
_SCRIPT_PREFIX = "monitor: "


@dataclass(frozen=True)
class JobInfo:
    """The kind of run: ``loop`` (commtop's synthetic loop), ``job`` (a user's script) or ""
    (nothing said yet)."""

    kind: str = ""
    script: str = ""  # a job's script name ("train.py")
    capture: str = ""  # how a job's records are captured ("flight recorder", "python hooks", ...)
    mode_knob: str = ""  # a job's knob that fills the records' mode column ("" = none)

    @property
    def is_job(self) -> bool:
        return self.kind == "job"

    @property
    def has_modes(self) -> bool:
        """Offload modes (and their settings and slowdown) mean something in this run."""
        return self.kind != "job" or bool(self.mode_knob)

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> JobInfo:
        config = config or {}
        if config.get("source") == "monitor":
            script = str(config.get("collective") or "").removeprefix(_SCRIPT_PREFIX)
            return cls("job", script or "?", str(config.get("capture") or ""), str(config.get("mode_knob") or ""))
        if config.get("collective"):
            return cls("loop")
        return cls()
