"""Per-run connection files: where a run's sockets are and the key that signs its messages.

Like a Jupyter kernel connection file: one JSON file of mode 0600 in a per-user directory
of mode 0700. Local runs put their ``ipc://`` sockets in the same directory, so other users
of a shared GPU node can neither connect nor read the key (loopback TCP would let them
connect). The key never travels on a command line: workers and `ctl` read this file.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from workers.wire.protocol import new_key, new_session_id

CONNECTION_FILE_ENV = "COMMTOP_CONNECTION_FILE"
RUNTIME_DIR_ENV = "COMMTOP_RUNTIME_DIR"
FILE_NAME = "connection.json"
IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


class ConnectionError_(RuntimeError):
    """A connection file or runtime directory is missing, unsafe or unreadable."""


@dataclass(frozen=True)
class Connection:
    """A run's endpoints and secret. ``data``: collector binds PULL, workers PUSH to it;
    ``control``: collector binds PUB, workers SUB (desired settings); ``request``: collector
    binds ROUTER, `ctl` sends signed requests."""

    run_id: str
    session: str
    key_hex: str
    data: str
    control: str
    request: str
    host: str
    created_ns: int
    #: ``[HOST:]PORT`` where every node's sampler serves Prometheus metrics ("" = off); set by
    #: `commtop run/watch --prometheus`, so workers started with this file export without the option.
    prometheus: str = ""
    path: str = ""

    @property
    def key(self) -> bytes:
        return bytes.fromhex(self.key_hex)

    @property
    def run_dir(self) -> Path:
        return Path(self.path).parent

    def for_connect(self, endpoint: str) -> Connection:
        """This run as seen by a worker given ``--connect tcp://HEAD:PORT``: data goes to
        ``endpoint`` and the control/request endpoints move to the same host."""
        host = tcp_host(endpoint)
        if host is None:
            return replace(self, data=endpoint)

        def moved(other: str) -> str:
            port = other.rsplit(":", 1)[-1] if other.startswith("tcp://") else ""
            return f"tcp://{host}:{port}" if port else other

        return replace(self, data=endpoint, control=moved(self.control), request=moved(self.request))


def tcp_host(endpoint: str) -> str | None:
    """The host part of a tcp:// endpoint, or None for other transports."""
    if not endpoint.startswith("tcp://"):
        return None
    return endpoint[len("tcp://") :].rsplit(":", 1)[0].strip("[]")


def tcp_endpoints(listen: str) -> tuple[str, str, str]:
    """data/control/request endpoints for ``--listen tcp://ADDR:PORT`` (PORT, PORT+1, PORT+2)."""
    host = tcp_host(listen)
    try:
        port = int(listen.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        raise ConnectionError_(f"--listen must look like tcp://0.0.0.0:5555; got {listen!r}") from None
    if host is None or not 0 < port < 65534:
        raise ConnectionError_(f"--listen must look like tcp://0.0.0.0:5555; got {listen!r}")
    return listen, f"tcp://{host}:{port + 1}", f"tcp://{host}:{port + 2}"


def runtime_root() -> Path:
    """This user's commtop directory (created 0700; refused if another user owns it)."""
    base = os.environ.get(RUNTIME_DIR_ENV)
    if base:
        root = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        root = Path(os.environ["XDG_RUNTIME_DIR"]) / "commtop"
    else:
        root = Path("/tmp") / f"commtop-{os.getuid()}"
    _ensure_private_dir(root)
    return root


def _ensure_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ConnectionError_(f"{path} is not a directory; refusing to use it")
    if info.st_uid != os.getuid():
        raise ConnectionError_(f"{path} belongs to uid {info.st_uid}, not you; refusing to use it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)


def create_run(
    data: str | None = None,
    control: str | None = None,
    request: str | None = None,
    label: str = "run",
    prometheus: str = "",
) -> Connection:
    """Make a run directory and its connection file; endpoints default to ipc:// in it."""
    root = runtime_root()
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{label[:12]}"
    run_dir = root / run_id
    suffix = 0
    while run_dir.exists():
        suffix += 1
        run_dir = root / f"{run_id}-{suffix}"
    longest = len(str(run_dir / "request.sock"))
    if longest > IPC_PATH_MAX:
        raise ConnectionError_(
            f"ipc socket paths under {root} would be {longest} characters (Linux allows "
            f"{IPC_PATH_MAX}); set {RUNTIME_DIR_ENV} to a shorter directory"
        )
    _ensure_private_dir(run_dir)
    conn = Connection(
        run_id=run_dir.name,
        session=new_session_id(),
        key_hex=new_key().hex(),
        data=data or f"ipc://{run_dir / 'data.sock'}",
        control=control or f"ipc://{run_dir / 'control.sock'}",
        request=request or f"ipc://{run_dir / 'request.sock'}",
        host=socket.gethostname(),
        created_ns=time.time_ns(),
        prometheus=prometheus,
        path=str(run_dir / FILE_NAME),
    )
    write(conn)
    return conn


def write(conn: Connection) -> None:
    """Write the file 0600 from the start (never world-readable, not even briefly)."""
    path = Path(conn.path)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({k: v for k, v in asdict(conn).items() if k != "path"}, fh, indent=1)
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> Connection:
    """Read a connection file; a clear one-line error if it is missing, unsafe or bad."""
    file = Path(path)
    try:
        info = file.stat()
        text = file.read_text()
    except OSError as exc:
        raise ConnectionError_(f"cannot read connection file {file}: {exc.strerror}") from None
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ConnectionError_(f"connection file {file} must be yours and mode 0600")
    try:
        data = json.loads(text)
        optional = ("prometheus", "path")  # absent from files written before these fields existed
        required = {k: data[k] for k in Connection.__dataclass_fields__ if k not in optional}
        conn = Connection(**required, prometheus=str(data.get("prometheus") or ""), path=str(file))
        bytes.fromhex(conn.key_hex)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConnectionError_(f"connection file {file} is not a commtop connection file ({exc})") from None
    return conn


def list_runs() -> list[Path]:
    """This user's connection files, newest first."""
    files = [p for p in runtime_root().glob(f"*/{FILE_NAME}") if p.is_file()]
    return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)


def newest_run() -> Connection:
    runs = list_runs()
    if not runs:
        raise ConnectionError_(f"no commtop run of yours found in {runtime_root()}; start one with `commtop run`")
    return load(runs[0])


def resolve(path: str | None = None) -> Connection:
    """The connection named by ``path``, else $COMMTOP_CONNECTION_FILE, else the newest run."""
    path = path or os.environ.get(CONNECTION_FILE_ENV)
    return load(path) if path else newest_run()


def find_by_endpoint(endpoint: str) -> Connection | None:
    """A connection file of this user whose data endpoint is ``endpoint`` (for ``--connect``)."""
    for file in list_runs():
        try:
            conn = load(file)
        except ConnectionError_:
            continue
        if conn.data == endpoint:
            return conn
    return None
