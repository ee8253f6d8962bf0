"""``commtop report``: per-mode and per-rank tables from a recording, comparisons of several
recordings, Perfetto traces and plots."""
