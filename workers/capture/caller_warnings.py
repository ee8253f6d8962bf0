"""Warnings raised inside a wrapped call, shown at the line that called it, as without commtop.

A wrapper adds a frame: a warning its callee issues with ``stacklevel=2`` (torch's DDP
constructor: "broadcast_buffers is deprecated") named commtop's wrapper line instead of the
user's. Only for calls made once (a constructor): ``warnings.catch_warnings`` swaps the
process's filters, which no per-collective wrapper may do.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def at_the_callers_line(wrapper_file: str, caller: FrameType) -> Iterator[None]:
    """Record every warning of the block, then issue each again through the job's filters: those
    that named ``wrapper_file`` at ``caller``'s line (in its module, its registry, its source
    line shown), the others where they were."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # the job's filters judge each below, at its real place
            yield
    finally:  # also when the call raised: what it warned before is shown, as without commtop
        _issue_again(caught, wrapper_file, caller)


def _issue_again(caught: list[warnings.WarningMessage], wrapper_file: str, caller: FrameType) -> None:
    for w in caught:
        if w.filename == wrapper_file:
            scope = caller.f_globals
            warnings.warn_explicit(
                w.message,
                w.category,
                caller.f_code.co_filename,
                caller.f_lineno,
                module=scope.get("__name__"),
                registry=scope.setdefault("__warningregistry__", {}),
                module_globals=scope,
            )
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
