"""An embedded PostgreSQL (the ``embedded`` extra, on pgserver) for first steps, the demo and
tests on a machine without a server.

The data directory is ``$POSTJOB_EMBEDDED_DIR`` if set, else
``$XDG_DATA_HOME/postjob_sa/pgdata`` (``~/.local/share/postjob_sa/pgdata``), so jobs survive
between runs. The server stops when the last process using it exits. Processes that start it
at once (a test suite's workers on a fresh machine) take turns: the first creates the system
user (as root), initializes the directory and starts the server, the others join it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from postjob_sa._db import SUPPORTED_DRIVERS
from postjob_sa.errors import InvalidArgument, PostjobError

INSTALL_HINT = "pip install 'postjob_sa[embedded]'"


class EmbeddedUnavailable(PostjobError):
    """pgserver is not installed (or could not start a server)."""


def data_dir() -> Path:
    """Where the embedded server keeps its data."""
    explicit = os.environ.get("POSTJOB_EMBEDDED_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "postjob_sa" / "pgdata"


_server: Any = None


def start_lock_path(target: Path) -> Path:
    """The file whose lock a process holds while it starts (or joins) the server of ``target``."""
    return target.parent / f".{target.name}.starting"


@contextmanager
def _starting(target: Path) -> Iterator[None]:
    """One process at a time starts the server of ``target``. pgserver's own lock is taken after
    it creates its system user (as root), so two first starts on a fresh machine ran ``useradd``
    and ``initdb`` side by side and one of them failed."""
    try:
        import fcntl
    except ImportError:  # Windows: pgserver runs no useradd there
        yield
        return
    with open(start_lock_path(target), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def server(path: Path | None = None) -> Any:
    """Start (or join) the embedded server and return its pgserver handle."""
    global _server
    if _server is not None:
        return _server
    try:
        import pgserver
    except ImportError:
        raise EmbeddedUnavailable(
            f"no database URL is configured and the embedded server is not installed: "
            f"{INSTALL_HINT}, or pass --database-url / set POSTJOB_DATABASE_URL"
        ) from None
    target = path or data_dir()
    target.mkdir(parents=True, exist_ok=True)
    try:
        with _starting(target):
            _server = pgserver.get_server(target, cleanup_mode="stop")  # type: ignore[attr-defined]
    except Exception as exc:
        raise EmbeddedUnavailable(f"the embedded PostgreSQL in {target} did not start: {exc}") from exc
    return _server


def database_url(path: Path | None = None, database: str = "postgres", driver: str = "psycopg") -> str:
    """A SQLAlchemy URL to a database of the embedded server, for ``driver``: ``"psycopg"``
    (psycopg 3, the default) or ``"psycopg2"``."""
    if driver not in SUPPORTED_DRIVERS:
        raise InvalidArgument(f"driver must be one of {', '.join(SUPPORTED_DRIVERS)}, not {driver!r}")
    srv = server(path)
    socket_dir = str(srv.pgdata)
    return f"postgresql+{driver}://postgres@/{database}?host={socket_dir}"
