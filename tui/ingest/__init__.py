"""What receives a run's messages, without Textual: the live and feed sources (sockets), the
ingest thread that applies them to the model and hands out snapshots, and the protocols between
the viewer's parts (Source, Sink, ReplayControls, ControllerLike, ...)."""
