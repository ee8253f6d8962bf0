"""Patching reaches every module that bound a function at its import: torch's own
(``init_device_mesh`` calls torch.distributed.device_mesh's ``init_process_group``, not
torch.distributed's: a mesh job's capture never started), a user's script and libraries
(``from torch.distributed import all_reduce``), and a spawned rank's script, whose globals no
module in sys.modules holds."""

from __future__ import annotations

import functools
import sys
import types

import pytest
import torch.distributed as dist
import torch.distributed.device_mesh as device_mesh
import torch.distributed.distributed_c10d as c10d

from workers.monitor import patch
from workers.monitor.patch import rebind


def test_rebind_replaces_the_function_wherever_torch_bound_it() -> None:
    original = c10d.init_process_group

    def stand_in(*args: object, **kwargs: object) -> None:
        """What a wrapper would be."""

    try:
        rebind("init_process_group", (original,), stand_in)
        assert c10d.init_process_group is stand_in and dist.init_process_group is stand_in
        assert device_mesh.init_process_group is stand_in  # type: ignore[attr-defined]
    finally:
        rebind("init_process_group", (stand_in,), original)
    assert device_mesh.init_process_group is original  # type: ignore[attr-defined]
    assert dist.init_process_group is original


def test_rebind_leaves_a_name_that_holds_something_else() -> None:
    original = c10d.new_group

    def other(*args: object, **kwargs: object) -> None:
        """Not the function being replaced."""

    rebind("new_group", (other,), lambda *a, **k: None)  # nothing holds ``other``: nothing changes
    assert c10d.new_group is original and device_mesh.new_group is original  # type: ignore[attr-defined]


def _module(name: str, **names: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(names)
    return module


def test_rebind_reaches_a_users_module_and_leaves_commtops_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``from torch.distributed import all_reduce`` in a user's script or library is rebound;
    commtop's own packages keep what they bound."""
    original = c10d.all_reduce
    user = _module("users_train_script", all_reduce=original)
    ours = _module("workers.some_module", all_reduce=original)
    monkeypatch.setitem(sys.modules, user.__name__, user)
    monkeypatch.setitem(sys.modules, ours.__name__, ours)
    monkeypatch.setitem(sys.modules, "odd_entry", object())  # not a module: skipped, no error

    def stand_in(*args: object, **kwargs: object) -> None:
        """What a wrapper would be."""

    try:
        rebind("all_reduce", (original,), stand_in)
        assert user.all_reduce is stand_in
        assert ours.all_reduce is original
    finally:
        rebind("all_reduce", (stand_in,), original)
    assert user.all_reduce is original and c10d.all_reduce is original


def test_a_spawned_scripts_globals_outside_sys_modules_are_patched_once_added() -> None:
    """multiprocessing runs a spawned rank's script from a copy of its globals: the job's
    function sees globals no module in sys.modules holds (add_globals names them)."""
    script_globals: dict[str, object] = {"all_reduce": c10d.all_reduce, "__name__": "__mp_main__"}
    exec("def job(rank):\n    return all_reduce\n", script_globals)  # noqa: S102 - a script's namespace, as runpy makes it
    job = script_globals["job"]
    assert callable(job)
    patch.patch()
    try:
        assert job(0) is getattr(c10d.all_reduce, "__commtop_original__", None)  # not reached yet
        patch.unpatch()
        patch.add_globals(functools.partial(job, 0))
        patch.patch()
        wrapped = job(0)
        assert wrapped is c10d.all_reduce and getattr(wrapped, "__commtop_original__", None) is not None
    finally:
        patch.unpatch()
    assert job(0) is c10d.all_reduce and getattr(job(0), "__commtop_original__", None) is None
