"""Workflows of bench/wakeup.py and bench/scale.py (``--import bench.fleet_app``).

Each run appends one line, ``job_id CLOCK_MONOTONIC-at-start``, to a file of its process in
``$BENCH_RUNS_DIR``: evidence of every run without a database connection per process (64
processes with one each would not fit in a default ``max_connections``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO

import postjob_sa

_lock = threading.Lock()
_file: IO[str] | None = None


def _record() -> None:
    global _file
    started = time.clock_gettime(time.CLOCK_MONOTONIC)
    with _lock:
        if _file is None:
            path = os.path.join(os.environ["BENCH_RUNS_DIR"], f"{os.getpid()}.runs")
            _file = open(path, "a", buffering=1)
        _file.write(f"{postjob_sa.current_job().id} {started!r}\n")


@postjob_sa.workflow(name="bench.record")
def record(key: int) -> int:
    """One run, one line."""
    _record()
    return key
