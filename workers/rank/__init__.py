"""One rank's plumbing, shared by the synthetic loop and the monitor: timers, the never-blocking
publisher, the heartbeat, and live control (the settings agreement through torchrun's store)."""
