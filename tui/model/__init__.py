"""The viewer's data path without Textual: message sources, the ingest thread, the run model
and its statistics, node telemetry. Live, replay and headless runs all go through it."""
