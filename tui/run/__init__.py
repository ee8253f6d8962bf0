"""Running jobs: one run's session (tui.run.session: live, watch, replay), what a job runs
(tui.run.job_plan), the torchrun launcher, the control server that publishes desired
settings, the ``commtop ctl`` client, ``commtop ab`` and the headless summary."""
