"""A/B experiments on a live run, without Textual: the controller that alternates settings in
blocks, the statistics of its blocks, and the verdict line's text."""
