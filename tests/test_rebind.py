"""Patching reaches torch's own modules that bound a function at their import:
``init_device_mesh`` calls torch.distributed.device_mesh's ``init_process_group``, not
torch.distributed's (a mesh job's capture never started)."""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed.device_mesh as device_mesh
import torch.distributed.distributed_c10d as c10d

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
