"""How a rank ended, in words: the texts a Bye's reason and the summaries use (torch-free)."""

from __future__ import annotations

import re
import signal

#: An error a rank gets because a peer died (the collective broke), not a cause of its own.
_PEER_FAILED = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crash|remote process exited"
    r"|NCCL communicator was aborted|Broken pipe",
    re.IGNORECASE,
)


def peer_failed(error: str) -> bool:
    """Whether a rank's error (a Bye's reason, an exception line) is a peer's failure seen
    through a collective, rather than a cause of its own."""
    return bool(_PEER_FAILED.search(error))


def signal_name(code: int) -> str:
    """``SIGTERM`` for exit code -15 (a process ended by a signal); "" for a plain exit code."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return ""
    return ""


def ended_text(code: int) -> str:
    """``killed by SIGTERM`` or ``exit code 1``: how a process ended, from its exit code."""
    name = signal_name(code)
    return f"killed by {name}" if name else f"exit code {code}"


#: A C++ source location that torch/gloo/NCCL errors start with: "[/src/gloo/.../pair.cc:534] ".
_SOURCE_PREFIX = re.compile(r"^(?:\[[^\]\s]*[/\\][^\]\s]*:\d+\]\s*)+")


def bye_reason(exc: BaseException, limit: int = 512) -> str:
    """``"RuntimeError: Connection closed by peer [10.0.0.2]:4411"`` for a Bye: the message's
    first non-empty line without leading C++ source locations, which would otherwise fill
    the TUI's one-line note with a build path (the full traceback goes to stderr)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = _SOURCE_PREFIX.sub("", lines[0]) if lines else ""
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return cut_between_words(said, limit)


def cut_between_words(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else cut between two words (not inside one:
    "before repo") and marked "…"."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit - 1] + "…"
