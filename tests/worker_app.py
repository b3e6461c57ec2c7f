"""Workflows and a worker entry point for tests that run real worker processes.

    python -m tests.worker_app URL [--count N] [--lease S] [--batch N] [--concurrency N]
                               [--linger S]

With ``--linger S`` the process lives on for S seconds after ``work()`` returns (a host
process, not ``postjob run``) and says whether a job's code still ran meanwhile.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import postjob_sa


@postjob_sa.workflow(name="app.noop")
def noop(*args: object) -> None:
    return None


@postjob_sa.workflow(name="app.sleep")
def sleep(seconds: float, marker: str) -> str:
    """Record start and end in a side table through its own connection."""
    _mark(marker, "start")
    time.sleep(seconds)
    _mark(marker, "end")
    return marker


#: what app.busy is doing: whether its code runs, and how many steps it took
BUSY = {"running": 0, "steps": 0}


@postjob_sa.workflow(name="app.busy")
def busy(seconds: float, marker: str) -> str:
    """Python code that works for ``seconds`` (an interruption stops it at once)."""
    _mark(marker, "start")
    BUSY["running"] += 1
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            BUSY["steps"] += 1
            time.sleep(0.01)
        _mark(marker, "end")
        return marker
    finally:
        BUSY["running"] -= 1


@postjob_sa.workflow(name="app.stamp")
def stamp(key: int) -> float:
    """Record the moment the job body started (CLOCK_MONOTONIC is system-wide on Linux)."""
    started = time.clock_gettime(time.CLOCK_MONOTONIC)
    _mark(str(key), repr(started))
    return started


def _mark(marker: str, what: str) -> None:
    url = os.environ["POSTJOB_APP_URL"]
    eng = _engines.get(url)
    if eng is None:
        eng = _engines[url] = create_engine(url, pool_size=1)
    with eng.begin() as conn:
        conn.execute(
            text("INSERT INTO app_marks (marker, what, pid) VALUES (:m, :w, :p)"),
            {"m": marker, "w": what, "p": os.getpid()},
        )


_engines: dict[str, object] = {}  # type: ignore[type-arg]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--count", type=int)
    parser.add_argument("--lease", type=float, default=60.0)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--linger", type=float, default=0.0)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    os.environ["POSTJOB_APP_URL"] = opts.url
    engine = create_engine(opts.url)
    with Session(engine) as session:
        q = postjob_sa.JobQueue(session, fast_mode=True, lease=opts.lease, batch_size=opts.batch,
                                concurrency=opts.concurrency)
        print(f"worker {os.getpid()} ready", flush=True)
        n = q.work(count=opts.count)
        print(f"worker {os.getpid()} processed {n}", flush=True)
    if opts.linger:
        steps = BUSY["steps"]
        time.sleep(opts.linger)
        print(f"after work: {BUSY['running']} running, {BUSY['steps'] - steps} steps", flush=True)


if __name__ == "__main__":
    main()
