"""The processes of bench/soak.py: workers, the producer and the prober (multiprocessing, spawn).

Evidence of every run is kept outside the database: each run of ``soak.job`` appends one
fixed-width line (its job id and its key) to a file of its worker process, so the driver
counts runs by the files' sizes and checks at the end, key by key, that every job it enqueued
ran exactly once. ``soak.probe`` appends its key and when its body started (CLOCK_MONOTONIC,
system-wide on Linux) to a file of its own; the prober notes when each probe's enqueue
committed.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import IO

JOB, PROBE, OTHER = "soak.job", "soak.probe", "soak.other"
#: bytes of one run line: "%11d %11d\n"
RUN_LINE = 24
#: the longest a producer's transaction gets
MAX_BATCH = 5000
TICK = 0.02

_runs: IO[str] | None = None
_probes: IO[str] | None = None


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _register() -> None:
    import postjob_sa

    @postjob_sa.workflow(name=JOB)
    def job(key: int) -> None:
        assert _runs is not None
        _runs.write(f"{postjob_sa.current_job().id:11d} {key:11d}\n")

    @postjob_sa.workflow(name=OTHER)
    def other() -> None:
        """What a worker that must not take soak.job serves (the backlog's watch)."""

    @postjob_sa.workflow(name=PROBE)
    def probe(key: int) -> None:
        started = now()
        assert _probes is not None
        _probes.write(f"{key} {started!r}\n")


def engine_for(url: str, driver: str) -> object:
    from sqlalchemy import create_engine

    return create_engine(url.replace("postgresql://", f"postgresql+{driver}://", 1))


def tune(settings: list[str]) -> None:
    """Set MODULE.NAME=VALUE in this process (e.g. postjob_sa._hot_tables.DEAD_ROWS=20000)."""
    for item in settings:
        target, value = item.split("=", 1)
        module, name = target.rsplit(".", 1)
        mod = importlib.import_module(module)
        old = getattr(mod, name)
        setattr(mod, name, type(old)(value) if not isinstance(old, bool) else value == "on")


def worker(url: str, driver: str, runs_dir: str, batch: int, settings: list[str],
           workflows: list[str] | None) -> None:
    """A worker process: ``postjob run``'s loop (of ``workflows``: None for all), until
    SIGTERM."""
    global _runs, _probes
    from sqlalchemy.orm import Session

    import postjob_sa

    tune(settings)
    logging.basicConfig(filename=os.path.join(runs_dir, f"{os.getpid()}.log"),
                        level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("postjob_sa.worker").setLevel(logging.WARNING)
    logging.getLogger("postjob_sa.upkeep").setLevel(logging.INFO)
    _register()
    _runs = open(os.path.join(runs_dir, f"{os.getpid()}.runs"), "a", buffering=1 << 16)
    _probes = open(os.path.join(runs_dir, f"{os.getpid()}.probes"), "a", buffering=1)
    threading.Thread(target=_flush_often, args=(_runs,), daemon=True).start()
    engine = engine_for(url, driver)
    try:
        with Session(engine) as session:  # type: ignore[call-overload]
            postjob_sa.JobQueue(session, batch_size=batch).work(workflows=workflows)
    finally:
        _runs.close()
        _probes.close()


def _flush_often(out: IO[str]) -> None:
    """The run file's buffer reaches the file every 0.2 s (the driver counts by its size)."""
    while not out.closed:
        try:
            out.flush()
        except ValueError:  # closed meanwhile
            return
        time.sleep(0.2)


def producer(url: str, driver: str, rate: float, stop: Event, sent: Synchronized[int],
             first_key: int = 0) -> None:
    """Enqueue ``soak.job`` jobs at ``rate`` per second (keys from ``first_key`` on, in
    transactions of what is due each tick) until ``stop``; ``sent`` counts them."""
    from sqlalchemy.orm import Session

    import postjob_sa

    engine = engine_for(url, driver)
    start = now()
    done = 0
    with Session(engine) as session:  # type: ignore[call-overload]
        queue = postjob_sa.JobQueue(session)
        while not stop.is_set():
            due = min(int(rate * (now() - start)) - done, MAX_BATCH)
            if due <= 0:
                time.sleep(TICK)
                continue
            keys = range(first_key + done, first_key + done + due)
            queue.enqueue_many(JOB, [[k] for k in keys])
            session.commit()
            done += due
            sent.value = done


def prober(url: str, driver: str, runs_dir: str, stop: Event, every: float = 1.0) -> None:
    """Enqueue one ``soak.probe`` job every ``every`` seconds; note when each committed."""
    from sqlalchemy.orm import Session

    import postjob_sa

    engine = engine_for(url, driver)
    key = 0
    with open(Path(runs_dir) / "probes.sent", "a", buffering=1) as out, \
            Session(engine) as session:  # type: ignore[call-overload]
        queue = postjob_sa.JobQueue(session)
        next_at = now()
        while not stop.wait(max(0.0, next_at - now())):
            queue.enqueue(PROBE, key)
            session.commit()
            out.write(f"{key} {now()!r}\n")
            key += 1
            next_at += every
