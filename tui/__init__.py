"""commtop's viewer side (the ``commtop`` command); it never imports torch.

Layers, lowest first (pyproject.toml holds them as import-linter contracts):

- :mod:`tui.model`: a run's state and statistics (plain Python + numpy): the run model and its
  snapshots, rank state, skew and clock statistics, node telemetry, the settings in force.
- :mod:`tui.ingest`: what receives: live and feed sources (sockets), the ingest thread that
  applies messages to the model and hands out snapshots, the protocols between the parts.
- :mod:`tui.experiment`: A/B experiments: the block controller, its statistics, the verdict text.
- :mod:`tui.recordings`: the recording file format, writer, reader and replay source.
- :mod:`tui.report`: ``commtop report``: tables, comparisons, trace and plot export.
- :mod:`tui.run`: running jobs: torchrun launcher, control server, ``ctl``, headless summary.
- :mod:`tui.view`: the Textual app and its widgets (the only package that imports textual).
- :mod:`tui.cli`: the command line on top.
"""
