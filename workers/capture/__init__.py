"""Watch an unmodified PyTorch job: capture of collectives and copies without per-op Python.

``bootstrap`` runs the user's script (torchrun ``-m workers.capture.bootstrap train.py ...``)
with a :mod:`workers.monitor` underneath; ``flight_recorder`` and ``cupti_copies`` decode what
torch's Flight Recorder and CUPTI already record (torch-free, tested on H200 captures);
``cuda_capture`` drains them on a background thread and ``rows`` gives each record the step
it started in; ``fallback`` uses the Python hooks of :mod:`workers.monitor` where neither can run.
"""
