"""One lock order for every function: every pair of the operations that change jobs, run
concurrently on the same few job trees for a bounded time, meets no deadlock that reaches a
caller (the function tries again where PostgreSQL can still report one), and no worker meets
one either (it would try again too, and say so in its log).

The operations: a checkout in the caller's transaction with its outcomes, a worker's drain
(checkout and outcomes in batches), reap, cancel, reset, force, resolve, emit, prune and
queue limits. A feeder keeps trees coming (a root with children, a manual step and a job
waiting for an event), so that each operation keeps finding jobs in every state."""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidJobState, JobNotFound, JobQueue, Registry
from postjob_sa._db import sqlstate
from postjob_sa.cli import _query
from postjob_sa.models import FINAL_STATUSES

pytestmark = pytest.mark.slow

#: How long each pair runs.
SECONDS_PER_PAIR = 1.0
DEADLOCK = "40P01"

reg = Registry()


@postjob_sa.workflow(name="lo.work", registry=reg)
def work(n: int) -> int:
    return n


@postjob_sa.workflow(name="lo.wait", registry=reg)
def wait(key: str) -> Any:
    return postjob_sa.wait_for_event(key)


class Pool:
    """The trees the operations share: their jobs' ids, manual tokens and event keys."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[int] = []
        self.tokens: list[str] = []
        self.keys: list[str] = []

    def pick(self, rng: random.Random, what: list[Any]) -> Any:
        with self.lock:
            return rng.choice(what[-60:]) if what else None


def _feed(engine: Engine, pool: Pool, n: int) -> None:
    """One more tree: a root with two children, a manual step under the root, and a job that
    waits (once a worker runs it) for an event under a key of its own."""
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        root = q.enqueue(work, n, queue="lo").id
        kids = [q.enqueue(work, n * 10 + i, queue="lo", parent_id=root).id for i in (1, 2)]
        manual, token = s.execute(text(
            "WITH m AS (INSERT INTO postjob.postjobs (workflow, parent_id, queue) "
            "VALUES ('__manual__', :p, 'lo') RETURNING id) "
            "SELECT id, postjob.manual_token(id)::text FROM m"), {"p": root}).one()
        key = f"lo-key-{n}"
        waiter = q.enqueue(wait, key, queue="lo").id
        s.commit()
    with pool.lock:
        pool.ids += [root, *kids, int(manual), waiter]
        pool.tokens.append(token)
        pool.keys.append(key)


def _queue(s: Session) -> JobQueue:
    return JobQueue(s, fast_mode=True, registry=reg, batch_size=5)


def _checkout(engine: Engine, pool: Pool, rng: random.Random) -> None:
    with Session(engine) as s:
        q = _queue(s)
        for job in q.checkout(limit=3, queues=["lo"]):
            if rng.random() < 0.3:
                q.fail(job, RuntimeError("again"))
            else:
                q.complete(job, 1)
        s.commit()


def _drain(engine: Engine, pool: Pool, rng: random.Random) -> None:
    with Session(engine) as s:
        _queue(s).drain(queues=["lo"])


def _reap(engine: Engine, pool: Pool, rng: random.Random) -> None:
    with Session(engine) as s:
        _queue(s).reap()
        s.commit()


def _on_a_job(op: Callable[[JobQueue, int], Any]) -> Callable[[Engine, Pool, random.Random], None]:
    def run(engine: Engine, pool: Pool, rng: random.Random) -> None:
        job_id = pool.pick(rng, pool.ids)
        if job_id is None:
            return
        with Session(engine) as s:
            try:
                op(_queue(s), job_id)
                s.commit()
            except (InvalidJobState, JobNotFound):
                s.rollback()
    return run


def _resolve(engine: Engine, pool: Pool, rng: random.Random) -> None:
    token = pool.pick(rng, pool.tokens)
    if token is None:
        return
    with Session(engine) as s:
        try:
            _queue(s).resolve(token, "yes")
            s.commit()
        except (InvalidJobState, JobNotFound):
            s.rollback()


def _emit(engine: Engine, pool: Pool, rng: random.Random) -> None:
    key = pool.pick(rng, pool.keys)
    if key is None:
        return
    with Session(engine) as s:
        _queue(s).emit_event(key, "payload")
        s.commit()


def _prune(engine: Engine, pool: Pool, rng: random.Random) -> None:
    _query.prune(engine, older_than=0.001, statuses=[s.value for s in FINAL_STATUSES], batch=5)


def _limits(engine: Engine, pool: Pool, rng: random.Random) -> None:
    with Session(engine) as s:
        _queue(s).set_queue_limits("lo", concurrency=rng.choice([None, 1, 2, 5]))
        s.commit()


OPERATIONS: dict[str, Callable[[Engine, Pool, random.Random], None]] = {
    "checkout": _checkout,
    "drain": _drain,
    "reap": _reap,
    "cancel": _on_a_job(lambda q, i: q.cancel(i)),
    "reset": _on_a_job(lambda q, i: q.reset(i)),
    "force": _on_a_job(lambda q, i: q.force(i)),
    "resolve": _resolve,
    "emit": _emit,
    "prune": _prune,
    "limits": _limits,
}


class WorkerLog(logging.Handler):
    """What the workers of the drains said of deadlocks (they try again, and say so)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.deadlocks: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "deadlock" in message:
            self.deadlocks.append(message)


@pytest.fixture
def worker_log() -> Iterator[WorkerLog]:
    handler = WorkerLog()
    logger = logging.getLogger("postjob_sa")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _deadlocks(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")).scalar_one())


def _fast_deadlock_detection(engine: Engine) -> None:
    """Deadlocks found in 50 ms instead of 1 s (a superuser's setting: skipped without)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        try:
            conn.execute(text(f'ALTER DATABASE "{engine.url.database}" SET deadlock_timeout = '
                              "'50ms'"))
        except DBAPIError:
            pass
    engine.dispose()


def _run_pair(engine: Engine, names: tuple[str, str], seconds: float) -> list[str]:
    """Both operations in a loop, each in a thread of its own, beside a feeder, for
    ``seconds``; the deadlocks that reached them, and their other errors."""
    pool = Pool()
    for n in range(4):
        _feed(engine, pool, n)
    stop = threading.Event()
    problems: list[str] = []

    def loop(name: str, seed: int) -> None:
        rng = random.Random(seed)
        op = OPERATIONS[name]
        while not stop.is_set():
            try:
                op(engine, pool, rng)
            except DBAPIError as exc:
                state = sqlstate(exc)
                what = "deadlock" if state == DEADLOCK else f"error {state}"
                problems.append(f"{name} (beside {'/'.join(names)}): {what}: "
                                f"{' '.join(str(exc.orig).split())[:200]}")
            except Exception as exc:  # a bug: report it, keep going
                problems.append(f"{name} (beside {'/'.join(names)}): {type(exc).__name__}: {exc}")

    def feed() -> None:
        n = 4
        while not stop.wait(0.05):
            _feed(engine, pool, n)
            n += 1

    threads = [threading.Thread(target=loop, args=(names[0], 1)),
               threading.Thread(target=loop, args=(names[1], 2)),
               threading.Thread(target=feed)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), f"an operation of {names} did not return"
    return problems


def test_every_pair_of_operations_on_the_same_jobs_meets_no_deadlock(
        engine: Engine, clean: None, worker_log: WorkerLog) -> None:
    _fast_deadlock_detection(engine)
    before = _deadlocks(engine)
    problems: list[str] = []
    pairs = list(itertools.combinations_with_replacement(OPERATIONS, 2))
    for pair in pairs:
        problems += _run_pair(engine, pair, SECONDS_PER_PAIR)
    detected = _deadlocks(engine) - before
    deadlocks = [p for p in problems if ": deadlock: " in p]
    assert not deadlocks and not worker_log.deadlocks, (
        f"{len(deadlocks)} deadlocks reached callers, {len(worker_log.deadlocks)} met workers, "
        f"{detected} detected by the server in {len(pairs)} pairs:\n"
        + "\n".join(deadlocks[:20] + worker_log.deadlocks[:10]))
    assert not problems, "\n".join(problems[:30])
