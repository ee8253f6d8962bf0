"""What workers and viewer share, torch-free: the wire protocol and its record schema (every
record layout derives from its columns), the connection file, the live settings and the
control messages, the loop's configuration, bus-bandwidth factors, overlap classes, the one
percentile definition and the telemetry wire format.

Nothing here imports torch, zmq or textual (import-linter checks it), so the viewer, the node
sampler and tests can import it cheaply.
"""
