"""The Textual app and its widgets: draws snapshots of :mod:`tui.model`, sends key presses to
the control server. The only package of commtop that imports textual."""
