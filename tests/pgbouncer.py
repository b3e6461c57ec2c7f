"""A real PgBouncer (Debian's ``pgbouncer``) in transaction mode, started on a free port.

Used by the PgBouncer tests (``tests/worker/test_pgbouncer.py``) and the scale benchmark. The
pooler is *strict* by default: it runs ``DISCARD ALL`` after every transaction
(``server_reset_query_always``), so anything that leans on session state across transactions
(LISTEN, server-side prepared statements, session settings) fails every time, not only when
two clients happen to swap server connections.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import psycopg2
import pytest
from sqlalchemy.engine import URL

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return os.access(PGBOUNCER, os.X_OK)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """``with PgBouncer(server_url) as bouncer: bouncer.url(db_url)``."""

    def __init__(self, server_url: URL, *, pool_size: int = 4, strict: bool = True,
                 max_clients: int = 1000):
        self.server = server_url
        self.port = free_port()
        self.pool_size = pool_size
        self.strict = strict
        self.max_clients = max_clients
        self.dir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def _socket_dir(self) -> str | None:
        """The server's unix socket directory, when the URL names one (``?host=/dir``: the
        embedded server listens on a socket only)."""
        host = self.server.query.get("host")
        if isinstance(host, tuple):
            host = host[0]
        return host if host and host.startswith("/") else None

    def _run_as(self) -> str:
        """The user pgbouncer drops root for: one that may open the server's socket (the
        embedded server's directory belongs to the user it runs as), else ``postgres``."""
        socket_dir = self._socket_dir()
        if socket_dir is not None:
            return pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name
        return "postgres"

    def _config(self) -> str:
        # a socket directory in the URL's query wins over its host, as libpq has it
        host = self._socket_dir() or self.server.host or "127.0.0.1"
        port = self.server.port or 5432
        reset = ("server_reset_query = DISCARD ALL\nserver_reset_query_always = 1\n"
                 if self.strict else "")
        return (
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            f"admin_users = {self.server.username}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_clients}\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"{reset}"
        )

    def start(self) -> PgBouncer:
        self.dir.chmod(0o755)  # pgbouncer drops root for postgres: it must read its files
        (self.dir / "userlist.txt").write_text(f'"{self.server.username}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(self._config())
        argv = [PGBOUNCER, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            argv[1:1] = ["-u", self._run_as()]
        with open(self.dir / "stderr.log", "wb") as stderr:  # the child keeps its own copy
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg2.connect(self.libpq_url("pgbouncer")).close()
                return self
            except psycopg2.Error:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        path = self.dir / "stderr.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def url(self, db_url: URL) -> URL:
        """``db_url`` through the pooler (over TCP, whichever way the server is reached)."""
        return db_url.difference_update_query(["host"]).set(host="127.0.0.1", port=self.port)

    def libpq_url(self, database: str) -> str:
        return f"postgresql://{self.server.username}@127.0.0.1:{self.port}/{database}"

    def show(self, what: str) -> list[dict[str, object]]:
        """``SHOW POOLS`` etc. on the admin console."""
        conn = psycopg2.connect(self.libpq_url("pgbouncer"))
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(f"SHOW {what}")  # a fixed word from the caller, not input
                names = [d[0] for d in cur.description or ()]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@pytest.fixture(scope="module", name="bouncer")
def bouncer_fixture(server_url: URL) -> Iterator[PgBouncer]:
    """A strict PgBouncer in transaction mode with 3 server connections per database (fails
    on CI when pgbouncer is missing: .ci/run installs it)."""
    if not available():
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is missing: .ci/run installs Debian's pgbouncer package")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    with PgBouncer(server_url, pool_size=3) as b:
        yield b
