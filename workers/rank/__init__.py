"""One rank's plumbing, shared by the synthetic loop, the monitor and the capture: timers (CUDA
events, the host clock, CUPTI activity records), the never-blocking publisher, the heartbeat,
the rank's session, and live control (the settings agreement through torchrun's store)."""
