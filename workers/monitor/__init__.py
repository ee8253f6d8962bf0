"""Watch your own training job with commtop: the user-facing API (``from workers import monitor``).

:mod:`~workers.monitor.api` starts and stops the process's :class:`~workers.monitor.monitor.Monitor`
(the object the job holds: steps, copies, knobs), whose timers (:mod:`~workers.monitor.timers`),
knobs (:mod:`~workers.monitor.knobs`) and Hello metadata (:mod:`~workers.monitor.rank_info`)
live beside it; :mod:`~workers.monitor.patch` wraps ``torch.distributed`` collectives and
:mod:`~workers.monitor.records` batches their records.
"""

from workers.monitor.api import active, patch_distributed, start, stop, unpatch_distributed
from workers.monitor.monitor import Monitor

__all__ = ["Monitor", "active", "patch_distributed", "start", "stop", "unpatch_distributed"]
