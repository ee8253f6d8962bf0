"""The synthetic workload, ``torchrun ... -m workers``: the forum's collective + offload loop,
timed and published through :mod:`workers.rank`, and ``python -m workers.synthetic.selfcheck``."""
