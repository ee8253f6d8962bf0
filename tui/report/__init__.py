"""``commtop report``: per-mode and per-rank tables from a recording, comparisons of several
recordings, Perfetto traces and plots.

``reading`` says what to read of a recording, ``build`` makes a :class:`~tui.report.rows.Report`
of it (numpy passes in ``kernels``, node telemetry in ``telemetry``), ``text`` writes it as a
table, JSON or CSV; ``compare``, ``trace`` and ``plot`` are the other outputs and ``command``
the command line over them all."""
