"""Fleets of real ``postjob run`` processes for bench/wakeup.py and bench/scale.py.

The jobs are ``bench.record`` (bench/fleet_app.py): each run appends its job id and when its
body started (CLOCK_MONOTONIC, system-wide on Linux) to a file of its process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import pg
from bench.harness.measure import process_cpu_seconds

ROOT = Path(__file__).resolve().parents[2]
POSTJOB = str(Path(sys.executable).parent / "postjob")
APP = "bench.fleet_app"
IDLE_WORKERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name LIKE 'postjob worker %' AND state = 'idle' "
    "AND query LIKE 'SELECT postjob.worker_idle%'"
)


def fresh_queue_database(base: str, name: str) -> str:
    """A new database with the postjob schema."""
    url = pg.fresh_database(base, name)
    subprocess.run([POSTJOB, "--database-url", url, "db", "migrate"], check=True,
                   capture_output=True)
    return url


def reset(url: str) -> None:
    pg.execute(url, "TRUNCATE postjob.postjobs, postjob.tokens, postjob.workers "
                    "RESTART IDENTITY CASCADE")


class Fleet:
    """Worker processes (supervisors or lone workers), stopped together."""

    def __init__(self, url: str):
        self.url = url
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log = tempfile.TemporaryFile()
        self.runs_dir = tempfile.TemporaryDirectory(prefix="postjob-bench-runs-")

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        argv = [POSTJOB, "--database-url", self.url, "run", "--import", APP, *args]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=self.log, stderr=self.log,
                                env={**os.environ, "BENCH_RUNS_DIR": self.runs_dir.name,
                                     "PYTHONPATH": str(ROOT)})
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process of the fleet, supervisors' children included."""
        out = []
        for proc in self.procs:
            out.append(proc.pid)
            try:
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
            except OSError:
                continue
            out += [int(p) for p in children.split()]
        return out

    def runs(self) -> list[tuple[int, float]]:
        """(job id, CLOCK_MONOTONIC at start) of every run so far."""
        out = []
        for path in Path(self.runs_dir.name).glob("*.runs"):
            for line in path.read_text().splitlines():
                job_id, started = line.split()
                out.append((int(job_id), float(started)))
        return out

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"a worker exited with status {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()

    def close(self) -> None:
        self.runs_dir.cleanup()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             check: Callable[[], None] = lambda: None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        check()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def cpu_seconds(pids: list[int]) -> float:
    return sum(process_cpu_seconds(p) or 0.0 for p in pids)
