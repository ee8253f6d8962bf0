"""The synthetic workload, ``torchrun ... -m workers``: the forum's collective + offload loop,
timed and published through :mod:`workers.rank`, with a straggler on demand (``delay``), and
``python -m workers.synthetic.selfcheck``, the loop on this machine's GPU."""
