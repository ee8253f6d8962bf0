"""The backend a rank's Hello names when the job made its group without naming one: torch says
"undefined" and keeps the device map. The map of a GPU node (cpu:gloo,cuda:nccl) cannot be made on
a CPU machine, so a stand-in for torch.distributed's two functions gives it (named so); the real
gloo case runs in tests/test_job_streams_recorded.py."""

from __future__ import annotations

import pytest

from workers.monitor.rank_info import backend_name


class FakeDist:
    """torch.distributed's get_backend and get_backend_config, as torch answers them."""

    def __init__(self, name: str, config: str) -> None:
        self.name, self.config = name, config

    def get_backend(self) -> str:
        return self.name

    def get_backend_config(self) -> str:
        return self.config


@pytest.mark.parametrize(
    ("name", "config", "said"),
    [
        ("nccl", "cuda:nccl", "nccl"),  # named: torch's word
        ("gloo", "cpu:gloo", "gloo"),
        ("undefined", "cpu:gloo", "gloo"),  # init_process_group() on a CPU machine
        ("undefined", "cpu:gloo,cuda:nccl", "nccl+gloo"),  # ... on a GPU node
        ("undefined", "", "undefined"),
    ],
)
def test_an_undefined_backend_is_named_by_its_device_map(name: str, config: str, said: str) -> None:
    assert backend_name(FakeDist(name, config)) == said
