"""What a widget's renderable says on a terminal, as plain text (a Rich Group or Text alike)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console


def plain(renderable: Any, width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()
