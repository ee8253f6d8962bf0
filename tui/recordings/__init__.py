"""Recordings: the ``.commtop`` file format (writer and reader) and the replay source."""
