"""Running jobs: the torchrun launcher, the control server that publishes desired settings,
the ``commtop ctl`` client and the headless summary."""
