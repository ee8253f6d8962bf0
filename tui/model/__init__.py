"""A run's state and statistics, plain Python + numpy: no sockets, no threads of its own, no
Textual. Every accepted message is applied to the run model (per-rank rings and aggregates,
node telemetry, the settings in force); it hands out frozen snapshots with the statistics the
viewer shows (windows, whole run, overlap classes, stragglers, skew, clock offsets, epochs).
Live, replay and headless runs all fill it through :mod:`tui.ingest`."""
