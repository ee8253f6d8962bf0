"""Recordings: the ``.commtop`` file (``codec``: layout and chunk codec; ``writer``; the live
``recorder``; ``reader`` and its ``bulk`` column reader; chunk ``summary``) and the replay source."""
