"""The Textual app and its widgets: draws the snapshots of :mod:`tui.model` that
:mod:`tui.ingest` hands out, sends key presses to the control server, and holds the view's
helpers (the chart's time axis). The only package of commtop that imports textual."""
