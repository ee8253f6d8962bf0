"""Node telemetry (TELEM / TELEM_CAPS bodies) kept in bounded ring buffers for the TUI.

Plain Python (no Textual, no torch). Minimal first version: the public surface
(`TelemetryModel.apply`, `.snapshot`, `TelemetrySnapshot.host_line`) is stable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TelemetrySnapshot:
    """Everything the links panel and header need at one moment."""

    t_ns: int = 0
    nvml_note: str = "no telemetry yet"

    def host_line(self) -> str:
        """One line for the header: node CPU %, host memory, sampler cost."""
        return "host: no telemetry yet"

    def proc_status(self, host: str, pid: int) -> str | None:
        """Process state of a worker pid as the node sampler saw it (None = unknown)."""
        return None


class TelemetryModel:
    """Applies decoded TELEM / TELEM_CAPS bodies; builds frozen snapshots."""

    def apply(self, body: dict[str, Any]) -> None:
        return None

    def snapshot(self, now_ns: int) -> TelemetrySnapshot:
        return TelemetrySnapshot(t_ns=now_ns)
