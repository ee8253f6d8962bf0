"""commtop's viewer side (the ``commtop`` command); it never imports torch.

- :mod:`tui.model`: plain-Python data path: sources, ingest thread, run model, statistics.
- :mod:`tui.view`: the Textual app and its widgets (the only package that imports textual).
- :mod:`tui.recordings`: the recording file format, writer, reader and replay source.
- :mod:`tui.report`: ``commtop report``: tables, comparisons, trace and plot export.
- :mod:`tui.run`: running jobs: torchrun launcher, control server, ``ctl``, headless summary.
- :mod:`tui.cli`: the command line on top.
"""
