"""The node exporter inside the node sampler process: a receiver thread that verifies and
decodes the ranks' tapped batches into :class:`NodeMetrics`, and prometheus_client's HTTP
server. Nothing here runs in a rank.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from workers.export.metrics import Collector, NodeMetrics
from workers.export.tap import LINGER_ENV, tap_endpoint
from workers.wire import exporter_address, protocol

log = logging.getLogger("commtop.prometheus")
RCVHWM = 1024
POLL_MS = 200


class NodeExporter:
    """Binds the node's tap socket and HTTP endpoint; :meth:`close` stops both."""

    def __init__(self, connection: Any, host: str, address: str) -> None:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.process_collector import ProcessCollector

        self.key, self.session = connection.key, connection.session
        self.metrics = NodeMetrics(host)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector(self.metrics))  # type: ignore[arg-type]
        ProcessCollector(registry=self.registry)  # the exporter's own CPU and memory (process_*)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, RCVHWM)
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAC_BYTES + protocol.MAX_BODY_BYTES + 64)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = tap_endpoint(self.session, host)
        self.tap_path = Path(self.endpoint[len("ipc://") :])
        _unlink(self.tap_path)  # a socket file left by a killed sampler of this run and node
        self._sock.bind(self.endpoint)
        bind_host, port = exporter_address.parse(address)
        if exporter_address.is_wide(bind_host):
            log.warning(exporter_address.warning(address))
        try:
            self._server, _ = start_http_server(port, addr=bind_host, registry=self.registry)
        except BaseException:  # port in use, ...: the sampler goes on without an endpoint
            self._sock.close(0)
            self._ctx.term()
            _unlink(self.tap_path)
            raise
        self.url = exporter_address.url(bind_host, self._server.server_port)
        self.url_file = Path(connection.path).parent / exporter_address.URL_FILE.format(host=host)
        _write_json(self.url_file, {"url": self.url, "host": host, "pid": os.getpid()})
        log.info("prometheus endpoint %s (ranks push to %s)", self.url, self.endpoint)
        print(f"commtop: prometheus endpoint of {host}: {self.url}", file=sys.stderr, flush=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="commtop-prometheus-rx", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        next_check = time.monotonic()
        while not self._stop.is_set():
            if poller.poll(POLL_MS):
                for _ in range(256):  # drain what is queued, then look at the clock again
                    try:
                        frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except zmq.ZMQError:
                        return
                    self.take(frames)
            now = time.monotonic()
            if now >= next_check:
                self.metrics.check_stalls()
                next_check = now + 0.5

    def take(self, frames: list[bytes]) -> None:
        """Verify (signature first, as the collector does), decode, fold in; refuse and count."""
        try:
            message = protocol.decode(protocol.open_frames(self.key, frames, self.session))
        except protocol.ProtocolError as exc:
            self.metrics.reject(exc.reason)
            return
        self.metrics.add_message(message)

    def linger(self, stop: Any) -> None:
        """Keep serving for $COMMTOP_PROMETHEUS_LINGER_S after the ranks exited (default 0), so a
        scrape can still read a short job's final counts; ``stop()`` true ends it early."""
        try:
            seconds = min(max(float(os.environ.get(LINGER_ENV, "0")), 0.0), 3600.0)
        except ValueError:
            seconds = 0.0
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop():
            time.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._server.shutdown()
        self._server.server_close()
        self._sock.close(0)
        self._ctx.term()
        # libzmq leaves a bound ipc socket's file behind; one per run and node piled up
        _unlink(self.tap_path)
        _unlink(self.url_file)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)
