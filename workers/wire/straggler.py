"""The straggler test: is the rank most often last *clearly* so, or is it chance?

One rule for the viewer (the ◀ marker, :mod:`tui.model.skew`) and the node exporter
(``commtop_rank_straggler_iterations_total``, :mod:`workers.export.metrics`), so they name the
same rank. All ranks leave a collective together, so the rank that arrived last waited least.
"""

from __future__ import annotations

import functools
import math

#: Newest complete iterations the test looks at.
STRAGGLER_ITERS = 256


@functools.lru_cache(maxsize=4096)
def clearly_last(count: int, total: int, n: int) -> bool:
    """Was the most-often-last of ``n`` ranks last in ``count`` of ``total`` iterations far more
    often than chance? With many ranks someone is always last a few times: twice the fair
    share is noise at 64 ranks. Here the binomial upper tail (p = 1/n) must be below
    1e-4 / n (Bonferroni over the ranks), and the share at least twice the fair one (90 %
    for two ranks)."""
    if n < 2 or total == 0 or count < min(0.9, 2 / n) * total:
        return False
    p = 1.0 / n
    log_p, log_q = math.log(p), math.log1p(-p)
    head = math.lgamma(total + 1)
    tail = sum(
        math.exp(head - math.lgamma(k + 1) - math.lgamma(total - k + 1) + k * log_p + (total - k) * log_q)
        for k in range(count, total + 1)
    )
    return tail < 1e-4 / n
