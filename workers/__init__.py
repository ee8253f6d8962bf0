"""commtop's worker side: everything that runs in or beside the job being watched.

``wire`` is what workers and viewer share (protocol, connection files, settings, the schema);
``rank`` is one rank's plumbing (timers, publisher, heartbeat, live control); on it run the
``synthetic`` collective + offload loop (``torchrun ... -m workers``), the ``monitor`` API a
user's job calls, and ``capture``, which watches an unmodified job; ``telemetry`` is the node
sampler process and ``export`` its Prometheus endpoint.

Importing this package must stay cheap and torch-free: the TUI imports
``workers.wire.protocol``. Modules that need torch import it themselves.
"""
