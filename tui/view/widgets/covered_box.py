"""The containers around the grid, whose children cover them: their own lines are rendered
once per change, not at every frame.

Textual's partial repaint renders every widget whose clip overlaps what changed; a container
that is a child of the screen overlaps every change. Its own lines (a background, under its
children) then went through Textual's styles cache again at every frame for nothing: ~0.06-0.1
ms a container a frame on the VM, with the grid's new lines 15 times a second. Here the lines
rendered last are handed back while the region and the crop are the same and nothing asked for
a repaint or changed a style. (The screen itself is the same case; a Screen subclass changed
which CSS rules its widgets got, so it is left as Textual makes it.)
"""

from __future__ import annotations

from typing import Any

from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.strip import Strip


class CoveredBox(Vertical):
    """A vertical container whose children fill it (height auto, or docked with height auto),
    keeping the lines it rendered last."""

    _kept_lines: tuple[tuple[Region, Size], list[Strip]] | None = None

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False) -> Any:
        self._kept_lines = None
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def notify_style_update(self) -> None:
        self._kept_lines = None
        super().notify_style_update()

    def render_lines(self, crop: Region) -> list[Strip]:
        key = (crop, self.region.size)
        kept = self._kept_lines
        if kept is not None and kept[0] == key:
            return kept[1]
        lines = super().render_lines(crop)
        self._kept_lines = (key, lines)
        return lines
