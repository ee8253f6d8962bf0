"""commtop's worker side: the instrumented collective + offload loop run under torchrun.

Importing this package must stay cheap and torch-free: the TUI imports
``workers.wire.protocol``. Modules that need torch import it themselves.
"""
