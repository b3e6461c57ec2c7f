"""A PostgreSQL cluster a test owns (so it may stop and restart it): initdb in a temporary
directory, on a free port, with Debian's binaries or pgserver's bundled ones. As root it runs
as a dedicated OS user (postgres refuses to run as root), the way pgserver does."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import URL

TIMEOUT = 60


def _bin_dir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    try:
        import pgserver

        candidates.append(str(Path(pgserver.__file__).parent / "pginstall" / "bin"))
    except ImportError:
        pass
    for c in candidates:
        if (Path(c) / "pg_ctl").exists() and (Path(c) / "initdb").exists():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ScratchServer:
    def __init__(self) -> None:
        bindir = _bin_dir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries (Debian's or pgserver's) to start a cluster")
        self.bindir = bindir
        self.user: str | None = None
        if os.geteuid() == 0:
            for name in ("postgres", "pgserver"):
                try:
                    pwd.getpwnam(name)
                    self.user = name
                    break
                except KeyError:
                    continue
            if self.user is None:
                from pgserver.utils import ensure_user_exists  # type: ignore[import-untyped]

                ensure_user_exists("pgserver")
                self.user = "pgserver"
        self.root = Path(tempfile.mkdtemp(prefix="postjob-scratch-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = _free_port()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        kw: dict[str, Any] = {"user": self.user} if self.user else {}
        subprocess.run([str(self.bindir / tool), *args], check=True, capture_output=True,
                       timeout=TIMEOUT, cwd=self.root, **kw)

    @property
    def url(self) -> URL:
        return URL.create("postgresql+psycopg2", username="postgres", host="127.0.0.1",
                          port=self.port, database="postgres")

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w",
                  "-t", str(TIMEOUT), "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", str(TIMEOUT), "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)
