"""`commtop ctl`: change a running job's settings from another shell.

    commtop ctl status
    commtop ctl mode overlap
    commtop ctl set copies=3 pinned=false

It talks to the collector (`commtop run` / `commtop watch`) of the newest run of this user,
or of ``--run`` (a run id or a connection file), over the run's ``request`` endpoint with
signed messages. ``set`` is replay-proof: it first asks ``status`` (read-only) for the
settings epoch, then sends the change with expected epoch = current + 1, so a replayed
request carries a stale epoch and is refused. By default it waits until the change is in
force on the workers and says at which iteration.

Exit codes: 0 done; 1 no answer / not in force in time; 2 bad arguments, a refused value,
or no such run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from tui.model.changeable import LOOP, LOOP_SETTINGS, UNKNOWN, Changeable
from workers.wire import connection as connections
from workers.wire import protocol
from workers.wire.control import ctl_request_body
from workers.wire.protocol import MODES
from workers.wire.settings import DELAY_ON, MAX_DELAY_MS, Settings, SettingsError, parse_assignment

REPLY_TIMEOUT_S = 3.0
WAIT_S = 20.0
STALE_RETRIES = 5
BUILTIN = frozenset(LOOP_SETTINGS)


class CtlError(RuntimeError):
    """A failure with its exit code; the message is one line for the user."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


EPILOG = f"""examples:
  commtop ctl status                      what is requested and in force, and what the run can change
  commtop ctl mode sync-barrier           MODE: {", ".join(MODES)}
  commtop ctl set copies=3 pinned=false
  commtop ctl set delay_ms=110 delay_rank=1   a straggler: rank 1 waits 110 ms before each collective
  commtop ctl set knob.offload=sync       a knob your job declared (workers.monitor: mon.knob)
  commtop ctl --run 20261202-1530 status  a run id (or prefix) or a connection file
names (commtop's own loop): {", ".join(LOOP_SETTINGS)}
  delay_ms 0..{MAX_DELAY_MS:g}, delay_rank a rank or -1 (every rank r waits r/(n-1) of it), delay_on {"/".join(DELAY_ON)}
names (your job): knob.NAME for each knob it declared, and mode when one knob takes offload modes;
  an unmodified script has none
The options work before or after the subcommand (commtop ctl mode sync --no-wait)."""


def _add_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The shared options; on the subcommands with SUPPRESSed defaults, so that an option
    given before the subcommand is not reset by the subcommand's own default."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--run", default=default(None), help="run id or connection file (default: your newest live run)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=default(REPLY_TIMEOUT_S),
        metavar="SECONDS",
        help=f"seconds to wait for a reply (default: {REPLY_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--no-wait", action="store_true", default=default(False), help="return once accepted, not once in force"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=default(WAIT_S),
        dest="wait_s",
        metavar="SECONDS",
        help=f"seconds to wait until in force (default: {WAIT_S:g})",
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print the collector's reply as JSON"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`commtop ctl`'s options and its subcommands (status, mode, set), on its subparser (tui.cli)."""
    from tui.args import OneLineParser

    parser.description = "change a running commtop job's settings"
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    _add_options(parser, top=True)
    sub = parser.add_subparsers(dest="op", required=True, metavar="{status,mode,set}", parser_class=OneLineParser)
    status = sub.add_parser("status", help="settings requested and in force, pending switch, refused messages")
    mode = sub.add_parser("mode", help=f"switch the offload mode: commtop ctl mode MODE ({', '.join(MODES)})")
    mode.add_argument("mode", metavar="MODE", help=", ".join(MODES))
    setp = sub.add_parser("set", help=f"set name=value ... ({', '.join(LOOP_SETTINGS)}, knob.NAME)")
    setp.add_argument("assignments", nargs="+", metavar="NAME=VALUE")
    for p in (status, mode, setp):
        _add_options(p, top=False)


#: Envelope fields of a reply (request nonce, session id, schema, kind): plumbing, not status.
ENVELOPE = ("nonce", "s", "v", "k", "t")


def as_json(reply: dict[str, Any]) -> str:
    """The reply for scripts: the collector's answer without the envelope that authenticated it."""
    return json.dumps({k: v for k, v in reply.items() if k not in ENVELOPE}, indent=1, sort_keys=True)


def run(ns: argparse.Namespace) -> int:
    """`commtop ctl ...`: the exit code (see the module docstring)."""
    try:
        changes = _changes(ns)
        conn = resolve_run(ns.run)
        with CtlClient(conn, timeout_s=ns.timeout) as client:
            if changes is None:
                reply = client.status()
                print(as_json(reply) if ns.json else format_status(conn, reply))
                return 0
            reply = client.set(changes)
            epoch = int(reply["epoch"])
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in changes.items())
            if ns.no_wait:
                print(as_json(reply) if ns.json else f"requested {shown} (epoch {epoch})")
                return 0
            reply, apply_at = client.wait_in_force(epoch, ns.wait_s)
            if ns.json:
                print(as_json(reply))
            else:
                where = f" from iteration {apply_at}" if apply_at >= 0 else ""
                print(f"{shown}: in force{where} (epoch {epoch})")
            return 0
    except CtlError as exc:
        print(f"commtop ctl: error: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `commtop ctl status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _changes(ns: argparse.Namespace) -> dict[str, Any] | None:
    """The requested changes, checked before anything is sent (out of range -> exit 2)."""
    if ns.op == "status":
        return None
    if ns.op == "mode":
        changes: dict[str, Any] = {"mode": ns.mode}
    else:
        changes = {}
        for text in ns.assignments:
            try:
                name, value = parse_assignment(text)
            except SettingsError as exc:
                raise CtlError(str(exc), 2) from None
            changes[name.replace("-", "_")] = value
    plain = {k: v for k, v in changes.items() if k in BUILTIN}
    try:
        Settings().updated(plain)  # other names (a job's knobs) are checked by the collector, which knows them
    except SettingsError as exc:
        raise CtlError(f"{exc}; nothing changed", 2) from None
    return changes


def resolve_run(run: str | None) -> connections.Connection:
    """A run id (or unique prefix) of this user, a connection file, $COMMTOP_CONNECTION_FILE,
    or the newest live run (its collector alive and answering; said on stderr)."""
    try:
        if run is None and os.environ.get(connections.CONNECTION_FILE_ENV):
            return connections.resolve(None)
        if run is None:
            return newest_live_run()
        path = Path(run)
        if path.is_file() or "/" in run or run.endswith(".json"):
            return connections.load(path)
        root = connections.runtime_root()
        exact = root / run / connections.FILE_NAME
        if exact.is_file():
            return connections.load(exact)
        matches = [p for p in root.glob(f"{run}*/{connections.FILE_NAME}") if p.is_file()]
        if len(matches) == 1:
            return connections.load(matches[0])
        if matches:
            names = ", ".join(sorted(p.parent.name for p in matches)[:5])
            raise CtlError(f"run {run!r} is ambiguous: {names}", 2)
        raise CtlError(f"no run {run!r} in {root}", 2)
    except connections.ConnectionError_ as exc:
        raise CtlError(str(exc), 2) from None


def newest_live_run(ping_s: float = 1.0) -> connections.Connection:
    """The newest run whose collector is alive (holds the run's lock) and answers a status
    request; folders of runs whose owner is gone are pruned on the way. Says which on stderr."""
    from tui.run.run_dirs import live_runs, owner_pid, prune_runs

    pruned = prune_runs()
    candidates = live_runs()
    silent: list[str] = []
    for path in candidates:
        try:
            conn = connections.load(path)
        except connections.ConnectionError_:
            continue
        try:
            with CtlClient(conn, timeout_s=ping_s) as client:
                client.status()
        except CtlError:
            silent.append(conn.run_id)
            continue
        print(f"commtop ctl: run {conn.run_id} (collector pid {owner_pid(path.parent) or '?'})", file=sys.stderr)
        return conn
    root = connections.runtime_root()
    why = f"{len(silent)} live but not answering ({', '.join(silent[:3])})" if silent else "none live"
    if pruned.removed:
        why += f"; removed {len(pruned.removed)} folder(s) of ended runs"
    raise CtlError(f"no running commtop run of yours in {root} ({why}); start one with `commtop run`", 2)


class CtlClient:
    """Signed request/reply with one collector (a DEALER on its ``request`` endpoint)."""

    def __init__(self, conn: connections.Connection, *, timeout_s: float = REPLY_TIMEOUT_S) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES + 1024)
        self._sock.connect(conn.request)

    def __enter__(self) -> CtlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        nonce = secrets.token_hex(16)
        body = ctl_request_body(self.conn.session, op, nonce, **fields)
        self._sock.send_multipart(protocol.seal(self.conn.key, body))
        deadline = time.monotonic() + self.timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self._sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                break
            frames = self._sock.recv_multipart()
            try:
                reply = protocol.open_frames(self.conn.key, frames, self.conn.session)
            except protocol.ProtocolError:
                continue  # not from our collector: ignore
            if reply.get("k") == protocol.CTL_REP and reply.get("nonce") == nonce:
                return reply
        raise CtlError(
            f"no reply from the collector of run {self.conn.run_id} within {self.timeout_s:g} s "
            "(is its `commtop run`/`watch` still running?)",
            1,
        )

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def set(self, changes: dict[str, Any], *, new_epoch: bool = False) -> dict[str, Any]:
        """Send a change against the current epoch; retried if another change came first.
        ``new_epoch``: start an epoch even if nothing changes (an A/B block, `commtop ab --run`)."""
        extra = {"new_epoch": True} if new_epoch else {}
        for _ in range(STALE_RETRIES):
            status = self.status()
            current = int(status.get("desired_epoch", -1))
            if current < 0:
                raise CtlError(str(status.get("note") or "the workers have not reported their settings yet"), 1)
            reply = self.call("set", changes=changes, expect=current + 1, **extra)
            if reply.get("ok"):
                return reply
            error = str(reply.get("error") or "refused")
            if not error.startswith(("stale request", "the workers are still switching")):
                raise CtlError(f"{error}; nothing changed", 2)
            time.sleep(0.2)
        raise CtlError("other changes kept coming first; nothing changed, try again", 1)

    def wait_in_force(self, epoch: int, wait_s: float) -> tuple[dict[str, Any], int]:
        """Poll status until the workers run ``epoch`` (or newer); returns (reply, apply_at)."""
        deadline = time.monotonic() + wait_s
        apply_at = -1
        while True:
            reply = self.status()
            if int(reply.get("pending_epoch", -1)) == epoch:
                apply_at = int(reply.get("apply_at", -1))
            if int(reply.get("epoch_in_force", -1)) >= epoch:
                if int(reply.get("epoch_in_force", -1)) == epoch and int(reply.get("in_force_since", -1)) >= 0:
                    apply_at = int(reply["in_force_since"])
                return reply, apply_at
            if time.monotonic() > deadline:
                raise CtlError(
                    f"accepted as epoch {epoch}, but not in force after {wait_s:g} s "
                    f"(in force: epoch {reply.get('epoch_in_force')}; {reply.get('note') or 'workers busy?'})",
                    1,
                )
            time.sleep(0.1)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _settings_line(settings: dict[str, Any], can: Changeable) -> str:
    """The settings that mean something in this run: all of the loop's (the delay's rank and
    place only while there is a delay), a job's mode and knobs."""
    if not settings:
        return "unknown"
    names: tuple[str, ...] = ("mode",)  # a job: its mode (the records') and its knobs
    if can.kind == LOOP or (can.kind == UNKNOWN and not settings.get("knobs")):
        names = ("mode", "copies", "copy_scale", "pinned", "direction", "delay_ms")
        if float(settings.get("delay_ms") or 0) > 0:
            names += ("delay_rank", "delay_on")
    parts = [f"{k}={_fmt(settings[k])}" for k in names if k in settings]
    parts += [f"knob.{k}={v}" for k, v in sorted(dict(settings.get("knobs") or {}).items())]
    return " ".join(parts)


def format_status(conn: connections.Connection, reply: dict[str, Any]) -> str:
    """The human-readable `ctl status`."""
    can = Changeable.from_wire(reply.get("can_change"))
    exited = int(reply.get("exited") or 0)
    lines = [f"run {conn.run_id}: {reply.get('ranks', 0)} rank(s) reporting" + (f", {exited} exited" if exited else "")]
    in_force = reply.get("in_force") or {}
    requested = reply.get("requested") or {}
    lines.append(f"in force  (epoch {reply.get('epoch_in_force', -1)}): {_settings_line(in_force, can)}")
    same = requested == in_force and reply.get("desired_epoch") == reply.get("epoch_in_force")
    shown = "same" if same else _settings_line(requested, can)
    lines.append(f"requested (epoch {reply.get('desired_epoch', -1)}): {shown}")
    if int(reply.get("pending_epoch", -1)) >= 0:
        lines.append(f"switching at iteration {reply.get('apply_at')} (epoch {reply.get('pending_epoch')})")
    lines.append(f"can change: {can.describe()}")
    if reply.get("note"):
        lines.append(str(reply["note"]))
    rejected = dict(reply.get("rejected") or {})
    by_reason = " ".join(f"{k}={v}" for k, v in sorted(rejected.items())) or "0"
    lines.append(f"refused control messages: collector {by_reason}; workers {reply.get('worker_rejected', 0)}")
    lines += [f"prometheus {url}" for url in prometheus_endpoints(conn, reply)]
    return "\n".join(lines)


def prometheus_endpoints(conn: connections.Connection, reply: dict[str, Any]) -> list[str]:
    """Every node's endpoint: those its samplers told the collector (every node, also another
    machine's) and those written beside this connection file (this node), once each."""
    from workers.wire.exporter_address import endpoints

    told = reply.get("prometheus")
    urls = [str(u)[:300] for u in told[:256]] if isinstance(told, list) else []
    return urls + [u for u in endpoints(conn.run_dir) if u not in urls]
