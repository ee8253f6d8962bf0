"""Fixtures every test gets."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`commtop run` keeps job logs under $XDG_STATE_HOME: a test's go to a temporary folder (and
    so do those of the commands it starts), never into the tester's home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
