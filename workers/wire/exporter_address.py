"""``--prometheus [HOST:]PORT``: where a node's Prometheus endpoint listens.

Torch-free and zmq-free, so `commtop run`/`watch` and the worker entry point reject a bad
address with one line before anything starts.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: Where a node's sampler writes its bound URL, in the run directory (beside the connection file).
URL_FILE = "prometheus-{host}.json"
#: The ipc socket a node's ranks push their batches to (workers.export.tap), in the runtime root:
#: its exporter removes it when it ends; the viewer prunes those of exporters that were killed.
TAP_FILE = "prom-{digest}.sock"


class AddressError(ValueError):
    """A ``--prometheus`` value that cannot be listened on; the message is one line."""


def parse(text: str) -> tuple[str, int]:
    """``"9400"`` -> (127.0.0.1, 9400); ``"0.0.0.0:9400"``; ``"[::1]:0"``; port 0 = any free port."""
    value = text.strip()
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = DEFAULT_HOST, value
    host = host.strip("[]") or DEFAULT_HOST
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise AddressError(f"--prometheus must look like [HOST:]PORT (PORT 0-65535, 0 = any free port); got {text!r}")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not all(part.isalnum() or "-" in part for part in host.split(".")):
                raise AddressError(f"--prometheus: {host!r} is not a host name or IP address") from None
    return host, int(port)


def is_wide(host: str) -> bool:
    """True when the endpoint is reachable from other machines (worth one line of warning)."""
    return host not in LOOPBACK


def warning(text: str) -> str:
    host, port = parse(text)
    return (
        f"warning: --prometheus {host}:{port} serves this node's metrics (ranks, timings, host name) to the "
        "network without authentication; bind 127.0.0.1 and let a local agent scrape it if that is not intended"
    )


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"


def endpoints(run_dir: Path) -> list[str]:
    """The URLs this run's node exporters wrote beside its connection file (`commtop ctl status`)."""
    urls = []
    for file in sorted(run_dir.glob(URL_FILE.format(host="*"))):
        try:
            data = json.loads(file.read_text())
            urls.append(f"{data['host']}: {data['url']}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return urls
