"""Issue 16, the TUI side: how to connect inside `watch`, help and command palette, ctrl+c,
SIGTERM, banners that say the change made. Pilot tests over the real LiveSource where data
is needed (FakePublisher sends real signed frames over real ZeroMQ)."""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from frozen_run import FakePublisher, frozen_hello

from tui.run.connect_help import connect_lines
from tui.view.app import CommtopApp, build_app
from tui.view.widgets.connect import ConnectPanel
from workers.wire.connection import Connection

KEY = bytes(range(32))
SESSION = "newcomer"
SIZE = (120, 36)


@pytest.fixture
def connection() -> Iterator[Connection]:
    path = Path(tempfile.mkdtemp(prefix="nc-", dir="/tmp"))
    yield Connection(
        run_id="t",
        session=SESSION,
        key_hex=KEY.hex(),
        data=f"ipc://{path}/data.sock",
        control="",
        request="",
        host="h",
        created_ns=0,
        path=str(path / "connection.json"),
    )
    shutil.rmtree(path, ignore_errors=True)


async def wait_for(pilot: Any, cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.05)


def run_async(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


@run_async
async def test_watch_shows_how_to_connect_until_the_first_rank_and_again_on_i(connection: Connection) -> None:
    app = build_app(connection=connection, title="commtop watch", connect=connect_lines(connection))
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(ConnectPanel)
        await pilot.pause()
        shown = panel.render().plain
        assert panel.display and connection.path in shown
        assert f"--connection-file {connection.path}" in shown and f"COMMTOP_CONNECTION_FILE={connection.path}" in shown
        pub = FakePublisher(app.source.endpoint, KEY, SESSION)  # type: ignore[union-attr]
        pub.send([frozen_hello(0, 1)])
        await wait_for(pilot, lambda: app.snapshot is not None and len(app.snapshot.ranks) == 1)
        await pilot.pause()
        assert not panel.display  # a rank arrived: the chart gets the room
        await pilot.press("i")
        assert panel.display
        await pilot.press("i")
        assert not panel.display
        pub.close()


@run_async
async def test_i_is_not_offered_where_there_is_nothing_to_connect() -> None:
    app = CommtopApp(links=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.query(ConnectPanel) and app.check_action("toggle_connect", ()) is False
