"""What workers and viewer share, torch-free: the wire protocol, the connection file, the live
settings, the loop's configuration, bus-bandwidth factors and the telemetry wire format.

Nothing here imports torch, zmq or textual (import-linter checks it), so the viewer, the node
sampler and tests can import it cheaply.
"""
