"""Through a real PgBouncer in transaction mode (tests/pgbouncer.py: a strict one, which forgets
every session setting, LISTEN and prepared statement after each transaction): enqueue and
``pooled=True`` workers run every job once, with several jobs at once and transactional jobs;
a worker that is not told it is pooled breaks there."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, JobQueue, _metrics
from postjob_sa._db import Conn
from postjob_sa.registry import Registry
from postjob_sa.worker.pooler import POOLED_HINT, transaction_pooling
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


def test_a_worker_not_told_it_is_pooled_breaks_through_the_pooler(
    pooled_url: URL, engine: Engine
) -> None:
    """The protection the tests above rely on: without pooled=True, psycopg 3 prepares the
    worker's statements on a server connection the next transaction does not get."""
    worker_engine = create_engine(pooled_url.set(drivername="postgresql+psycopg"))
    app = app_engine(pooled_url, "postgresql+psycopg")
    try:
        enqueue(app, "pgb.record", range(12))
        with Session(worker_engine) as s, pytest.raises(Exception, match="prepared statement"):
            JobQueue(s, fast_mode=True, registry=registry).drain()
    finally:
        app.dispose()
        worker_engine.dispose()


def _scalar(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def _wait_done(engine: Engine, n: int) -> None:
    wait_for(lambda: _scalar(engine, "SELECT count(*) FROM postjob.jobs "
                                     "WHERE status = 'ok'") == n, 15, f"{n} jobs ok")


@pytest.mark.parametrize("strict", [True, False], ids=["discard-all", "no-reset"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_worker_not_told_it_is_pooled_finds_the_pooler_at_start_and_refuses(
    server_url: URL, db_url: URL, engine: Engine, clean: None, driver: str, strict: bool
) -> None:
    """A long-running worker probes its connection: through a pooler in transaction mode its
    LISTEN is forgotten (strict) or handed to the next client (no reset); it refuses to start
    with one line that names --pooled, instead of losing its wake-ups."""
    with PgBouncer(server_url, pool_size=2, strict=strict) as pooler:
        worker_engine = create_engine(pooler.url(db_url).set(drivername=driver))
        try:
            with Session(worker_engine) as s, pytest.raises(InvalidArgument) as refused:
                JobQueue(s, fast_mode=True, registry=registry).work(count=1)
        finally:
            worker_engine.dispose()
    seen = ("its LISTEN was gone one transaction later" if strict
            else "a second connection was handed the same server session")
    assert str(refused.value) == POOLED_HINT.format(seen)
    # a direct connection keeps its session: the same probe finds nothing
    with engine.connect() as conn:
        direct = Conn.borrow(conn.connection.dbapi_connection, driver.partition("+")[2])
        conn.connection.dbapi_connection.autocommit = True
        assert transaction_pooling(direct, engine.execution_options()) is None


def test_postjob_run_through_the_pooler_without_pooled_exits_2_naming_the_flag(
    pooled_url: URL
) -> None:
    res = postjob("run", "--import", "postjob_sa.demo", url=url_string(pooled_url))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "postjob: " + POOLED_HINT.format(
        "its LISTEN was gone one transaction later")
