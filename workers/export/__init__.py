"""One Prometheus endpoint per node: the node sampler process serves every local rank's
collective and copy timings (tapped from their publishers) beside the GPU telemetry.

Only the node sampler imports :mod:`workers.export.server` (and prometheus_client); a rank
imports :mod:`workers.export.tap` alone, to know where to push its batches.
"""
