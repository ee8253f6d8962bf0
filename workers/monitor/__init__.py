"""Watch your own training job with commtop: the user-facing API (``from workers import monitor``).

The implementation is in :mod:`workers.monitor.api`; :mod:`workers.monitor.patch` wraps
``torch.distributed`` collectives and :mod:`workers.monitor.records` batches their records.
"""

from workers.monitor.api import Monitor, active, patch_distributed, start, stop, unpatch_distributed

__all__ = ["Monitor", "active", "patch_distributed", "start", "stop", "unpatch_distributed"]
