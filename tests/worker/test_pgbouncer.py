"""Through a real PgBouncer in transaction mode (tests/pgbouncer.py: a strict one, which forgets
every session setting, LISTEN and prepared statement after each transaction): enqueue and
``pooled=True`` workers run every job once, with several jobs at once and transactional jobs;
a worker that is not told it is pooled breaks there."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import AsyncJobQueue, JobQueue, _metrics
from postjob_sa._db import Conn
from postjob_sa.registry import Registry
from postjob_sa.worker import pooler
from postjob_sa.worker.pooler import DETECTED, WAKE_BY_POLL, WAKE_BY_URL, transaction_pooling
from tests.cli.test_cli_db import postjob
from tests.conftest import url_string
from tests.pgbouncer import (
    PgBouncer,
    bouncer_fixture,  # noqa: F401 (the fixture "bouncer")
)
from tests.reliability.conftest import wait_for

DRIVERS = ["postgresql+psycopg2", "postgresql+psycopg"]
registry = Registry()


def wf(name: str, **options: Any) -> Any:
    return postjob_sa.workflow(name=name, registry=registry, **options)


ran: Counter[int] = Counter()
_ran_lock = threading.Lock()


@wf("pgb.record")
def record(key: int) -> int:
    with _ran_lock:
        ran[postjob_sa.current_job().id] += 1
    return key


@wf("pgb.parent")
def parent(key: int) -> int:
    record(key)
    return int(record_child.spawn(key).result()) + 1


@wf("pgb.child")
def record_child(key: int) -> int:
    return record(key)


@wf("pgb.tx", transactional=True)
def transactional(session: Session, key: int) -> int:
    session.execute(text("INSERT INTO pgb_writes (job_id) VALUES (:j)"),
                    {"j": postjob_sa.current_job().id})
    return record(key)


@pytest.fixture
def pooled_url(bouncer: PgBouncer, db_url: URL, engine: Engine, clean: None) -> URL:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS pgb_writes (job_id bigint)"))
        conn.execute(text("TRUNCATE pgb_writes"))
    ran.clear()
    pooler._said.clear()  # each test's workers say it anew
    return bouncer.url(db_url)


def app_engine(url: URL, driver: str) -> Engine:
    """An application's engine through the pooler, set up as docs/operations.md says."""
    args = {"prepare_threshold": None} if driver == "postgresql+psycopg" else {}
    return create_engine(url.set(drivername=driver), connect_args=args)


def enqueue(engine: Engine, workflow: str, keys: range) -> list[int]:
    """One transaction per job, all on one pooled client connection."""
    ids = []
    for k in keys:
        with Session(engine) as s:
            ids.append(JobQueue(s).enqueue(workflow, k).id)
            s.commit()
    return ids


def statuses(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(r[0] for r in conn.execute(text("SELECT status::text FROM postjob.jobs")))


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("concurrency", [1, 4])
def test_enqueue_and_pooled_workers_through_pgbouncer_run_every_job_once(
    pooled_url: URL, engine: Engine, driver: str, concurrency: int
) -> None:
    app = app_engine(pooled_url, driver)
    # the worker's engine leaves psycopg 3 at its defaults: the worker protects its connections
    worker_engine = create_engine(pooled_url.set(drivername=driver))
    try:
        ids = enqueue(app, "pgb.record", range(12)) + enqueue(app, "pgb.tx", range(8))
        parents = enqueue(app, "pgb.parent", range(3))
        with Session(worker_engine) as s:
            queue = JobQueue(s, fast_mode=True, registry=registry, pooled=True,
                             concurrency=concurrency)
            queue.drain()
    finally:
        app.dispose()
        worker_engine.dispose()
    assert statuses(engine) == {"ok": 26}  # 12 + 8 transactional + 3 parents + 3 children
    # every job once; a parent twice: before its child ran (it sleeps) and after
    assert len(ran) == 26 and set(ids) <= set(ran)
    assert {i: ran[i] for i in parents} == dict.fromkeys(parents, 2)
    assert {n for i, n in ran.items() if i not in parents} == {1}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pgb_writes")).scalar() == 8


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_pooled_worker_waits_through_the_pooler_and_listens_on_the_direct_url(
    pooled_url: URL, db_url: URL, engine: Engine, driver: str
) -> None:
    """Idle, it is woken by a notification on its direct connection (a LISTEN through the
    pooler would be forgotten after its transaction)."""
    app = app_engine(pooled_url, driver)
    woken = _metrics.WAKEUPS.labels("notification")._value.get()
    done: list[int] = []
    try:
        with Session(app) as s:
            queue = JobQueue(s, fast_mode=True, registry=registry, pooled=True, lease=300,
                             wakeup_url=db_url.set(drivername=driver))
            w = queue._worker(count=3)
            worker = threading.Thread(target=lambda: done.append(w.run()), daemon=True)
            worker.start()
            try:
                for k in range(3):
                    wait_for(lambda: w.stopper.waiting, 10, "the worker waiting")
                    enqueue(app, "pgb.record", range(k, k + 1))
                    _wait_done(engine, k + 1)
            finally:
                w.stopper.request("the test is over")
                worker.join(timeout=30)
    finally:
        app.dispose()
    assert done == [3]
    assert _metrics.WAKEUPS.labels("notification")._value.get() - woken == 3


def test_a_pooled_worker_without_a_direct_url_polls(pooled_url: URL, engine: Engine) -> None:
    app = app_engine(pooled_url, "postgresql+psycopg")
    done: list[int] = []
    try:
        with Session(app) as s:
            queue = JobQueue(s, fast_mode=True, registry=registry, pooled=True, lease=300,
                             poll_interval=0.05)
            w = queue._worker(count=2)
            worker = threading.Thread(target=lambda: done.append(w.run()), daemon=True)
            worker.start()
            try:
                wait_for(lambda: w.stopper.waiting, 10, "the worker waiting")
                enqueue(app, "pgb.record", range(2))
                _wait_done(engine, 2)
            finally:
                w.stopper.request("the test is over")
                worker.join(timeout=30)
    finally:
        app.dispose()
    assert done == [2] and statuses(engine) == {"ok": 2}


def test_a_worker_told_it_is_not_pooled_breaks_through_the_pooler(
    pooled_url: URL, engine: Engine
) -> None:
    """The protection the tests above rely on: with pooled=False (the override: no probe),
    psycopg 3 prepares the worker's statements on a server connection the next transaction
    does not get."""
    worker_engine = create_engine(pooled_url.set(drivername="postgresql+psycopg"))
    app = app_engine(pooled_url, "postgresql+psycopg")
    try:
        enqueue(app, "pgb.record", range(12))
        with Session(worker_engine) as s, pytest.raises(Exception, match="prepared statement"):
            JobQueue(s, fast_mode=True, registry=registry, pooled=False).drain()
    finally:
        app.dispose()
        worker_engine.dispose()


def _measure(url: URL, n: int) -> None:
    """n jobs of postjob_sa.demo's demo.measure, for the CLI's workers."""
    app = app_engine(url, "postgresql+psycopg")
    try:
        with Session(app) as s:
            for _ in range(n):
                JobQueue(s).enqueue("demo.measure", "word")
            s.commit()
    finally:
        app.dispose()


def _scalar(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def _wait_done(engine: Engine, n: int) -> None:
    wait_for(lambda: _scalar(engine, "SELECT count(*) FROM postjob.jobs "
                                     "WHERE status = 'ok'") == n, 15, f"{n} jobs ok")


@pytest.mark.parametrize("strict", [True, False], ids=["discard-all", "no-reset"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_worker_not_told_it_is_pooled_finds_the_pooler_at_start_and_runs_as_pooled(
    server_url: URL, db_url: URL, engine: Engine, clean: None, driver: str, strict: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker probes its engine when it starts: through a pooler in transaction mode its
    LISTEN is forgotten (strict) or handed to the next client (no reset). It runs as if
    pooled=True were given and says so in one line that names --wakeup-url."""
    ran.clear()
    with PgBouncer(server_url, pool_size=2, strict=strict) as pooler:
        worker_engine = create_engine(pooler.url(db_url).set(drivername=driver))
        try:
            ids = enqueue(worker_engine, "pgb.parent", range(2))
            with caplog.at_level(logging.WARNING, logger="postjob_sa"), \
                    Session(worker_engine) as s:
                done = JobQueue(s, fast_mode=True, registry=registry, lease=300,
                                poll_interval=0.05).work(count=6)
        finally:
            worker_engine.dispose()
    assert done == 6 and statuses(engine) == {"ok": 4}  # 2 parents (2 runs each), 2 children
    assert set(ids) <= set(ran)
    seen = ("its LISTEN was gone one transaction later" if strict
            else "a second connection was handed the same server session")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [DETECTED.format(seen, WAKE_BY_POLL.format(0.05))]
    assert "--wakeup-url" in lines[0]
    # a direct connection keeps its session: the same probe finds nothing
    with engine.connect() as conn:
        direct = Conn.borrow(conn.connection.dbapi_connection, driver.partition("+")[2])
        conn.connection.dbapi_connection.autocommit = True
        assert transaction_pooling(direct, engine.execution_options()) is None


@pytest.mark.parametrize("driver", DRIVERS)
def test_drain_finds_the_pooler_too_and_says_so_once_per_database_url(
    pooled_url: URL, engine: Engine, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """step and drain probe as well (once per URL in a process: drain may be called in a
    loop); a worker given pooled=True probes nothing and says nothing."""
    worker_engine = create_engine(pooled_url.set(drivername=driver))
    try:
        with caplog.at_level(logging.WARNING, logger="postjob_sa"):
            for k in range(3):
                enqueue(worker_engine, "pgb.record", range(k, k + 1))
                with Session(worker_engine) as s:
                    assert JobQueue(s, fast_mode=True, registry=registry).drain() == 1
        assert [r.getMessage() for r in caplog.records] == [
            DETECTED.format("its LISTEN was gone one transaction later",
                            WAKE_BY_POLL.format(1))]
    finally:
        worker_engine.dispose()
    assert statuses(engine) == {"ok": 3}


def test_the_async_queue_finds_the_pooler(
    pooled_url: URL, db_url: URL, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_engine(pooled_url, "postgresql+psycopg")
    enqueue(app, "pgb.record", range(2))
    app.dispose()

    async def body() -> int:
        async_engine = create_async_engine(pooled_url.set(drivername="postgresql+psycopg"),
                                           connect_args={"prepare_threshold": None})
        try:
            async with AsyncSession(async_engine) as s:
                return await AsyncJobQueue(s, fast_mode=True, registry=registry,
                                           wakeup_url=db_url).drain()
        finally:
            await async_engine.dispose()

    with caplog.at_level(logging.WARNING, logger="postjob_sa"):
        assert asyncio.run(body()) == 2
    assert [r.getMessage() for r in caplog.records] == [
        DETECTED.format("its LISTEN was gone one transaction later",
                        WAKE_BY_URL)]
    assert statuses(engine) == {"ok": 2}


def test_postjob_run_through_the_pooler_without_pooled_runs_as_pooled(
    pooled_url: URL, engine: Engine
) -> None:
    _measure(pooled_url, 1)
    res = postjob("run", "--import", "postjob_sa.demo", "--count", "1",
                  url=url_string(pooled_url))
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if "pooler" in line]
    assert len(lines) == 1 and lines[0].endswith(DETECTED.format(
        "its LISTEN was gone one transaction later",
        WAKE_BY_POLL.format(1))), res.stderr
    assert statuses(engine) == {"ok": 1}


def test_postjob_run_with_processes_finds_the_pooler_once_for_all_of_them(
    pooled_url: URL, engine: Engine
) -> None:
    """The supervisor probes, and hands --pooled to its workers (it must not LISTEN through
    the pooler for them either)."""
    _measure(pooled_url, 2)
    res = postjob("run", "--import", "postjob_sa.demo", "--count", "1", "--processes", "2",
                  "--poll-interval", "0.1s", url=url_string(pooled_url), timeout=120)
    assert res.returncode == 0, res.stderr
    assert len([line for line in res.stderr.splitlines() if "pooler" in line]) == 1, res.stderr
    assert statuses(engine) == {"ok": 2}
