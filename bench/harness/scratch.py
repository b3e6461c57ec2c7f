"""A PostgreSQL cluster of the benchmark's own: initdb into a temporary directory, started on a
free port with PostgreSQL's default settings (plus the few a run asks for), removed at the end.

PostgreSQL refuses to run as root: as root, the cluster runs as the ``postgres`` OS user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

BINDIR = Path("/usr/lib/postgresql/15/bin")
TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ScratchCluster:
    """``with ScratchCluster({"autovacuum": "off"}) as pg: pg.url("postgres")``."""

    def __init__(self, settings: dict[str, str] | None = None, bindir: Path = BINDIR):
        if not (bindir / "initdb").exists():
            raise SystemExit(f"no PostgreSQL binaries in {bindir}")
        self.bindir = bindir
        self.settings = dict(settings or {})
        self.user = "postgres" if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="postjob-soak-"))
        self.data = self.root / "data"
        self.port = free_port()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _run(self, tool: str, *args: str) -> None:
        kw: dict[str, Any] = {"user": self.user} if self.user else {}
        subprocess.run([str(self.bindir / tool), *args], check=True, capture_output=True,
                       timeout=TIMEOUT, cwd=self.root, **kw)

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E",
                  "UTF8")
        options = [f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                   f"-c unix_socket_directories={self.root}"]
        options += [f"-c {k}={v}" for k, v in self.settings.items()]
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                  "-t", str(TIMEOUT), "-o", " ".join(options), "start")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def keep_log(self, path: str) -> None:
        shutil.copyfile(self.root / "server.log", path)

    def destroy(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ScratchCluster:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
