"""Async workflows and many jobs at once in one worker: real overlap, a lease per job, a
fan-out whose children each run once, and an event loop blocked by one job."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry

reg = Registry()
SPANS: dict[int, tuple[float, float]] = {}
RUNS: Counter[int] = Counter()
_lock = threading.Lock()
gate = threading.Event()


def _span(started: float) -> None:
    with _lock:
        SPANS[postjob_sa.current_job().id] = (started, time.monotonic())


@postjob_sa.workflow(name="cc.async_nap", registry=reg)
async def async_nap(seconds: float) -> str:
    started = time.monotonic()
    await asyncio.sleep(seconds)
    _span(started)
    return "rested"


@postjob_sa.workflow(name="cc.thread_nap", registry=reg)
def thread_nap(seconds: float) -> str:
    started = time.monotonic()
    time.sleep(seconds)
    _span(started)
    return "rested"


@postjob_sa.workflow(name="cc.child", registry=reg)
async def child(i: int) -> int:
    with _lock:
        RUNS[i] += 1
    await asyncio.sleep(0.001)
    return i * i


@postjob_sa.workflow(name="cc.fanout", registry=reg)
async def fanout(n: int) -> int:
    handles = [child.spawn(i) for i in range(n)]
    await postjob_sa.set_workflow_status_async(f"{n} children")
    return sum([await h for h in handles])


@postjob_sa.workflow(name="cc.gather", registry=reg)
async def gathered(n: int) -> dict[str, Any]:
    handles = [child.spawn(i) for i in range(n)]
    again = child.spawn(0)  # the same child, found again
    distinct = {*handles, again}  # handles can be put in sets (and dicts)
    results = await asyncio.gather(*handles, again)
    return {"results": results, "distinct": len(distinct), "same": again == handles[0]}


@postjob_sa.workflow(name="cc.approval", registry=reg)
async def approval() -> str:
    step = postjob_sa.manual("approve")
    token = await step.token_async()
    with _lock:
        TOKENS.append(token)
    return str(await step)


TOKENS: list[str] = []


@postjob_sa.workflow(name="cc.held", registry=reg)
async def held() -> str:
    await asyncio.get_running_loop().run_in_executor(None, gate.wait, 20)
    return "released"


def _drain(engine: Engine, concurrency: int, lease: float = 60.0) -> int:
    with Session(engine) as s:
        return JobQueue(s, fast_mode=True, registry=reg, concurrency=concurrency, lease=lease).drain()


def _overlap(ids: list[int]) -> bool:
    spans = [SPANS[i] for i in ids]
    return max(start for start, _ in spans) < min(end for _, end in spans)


@pytest.mark.parametrize("workflow", [async_nap, thread_nap], ids=["tasks", "threads"])
def test_jobs_of_one_worker_really_run_at_once(engine: Engine, clean: None, workflow: Any) -> None:
    with Session(engine) as s:
        ids = JobQueue(s, registry=reg).enqueue_many(workflow, [[0.4] for _ in range(8)])
        s.commit()
    started = time.monotonic()
    assert _drain(engine, concurrency=8) == 8
    elapsed = time.monotonic() - started
    assert _overlap(ids), {i: SPANS[i] for i in ids}  # every run was under way at one moment
    print(f"8 jobs of 0.4 s with concurrency 8 ({workflow.name}): {elapsed:.2f} s")


def test_each_running_job_is_fenced_on_its_own(engine: Engine, clean: None) -> None:
    """Four jobs of one checkout run at once under its lease; cancelling one of them ends that
    run only: the other three are recorded ok, the cancelled one stays cancelled."""
    gate.clear()
    with Session(engine) as s:
        ids = JobQueue(s, registry=reg).enqueue_many(held, [[] for _ in range(4)])
        s.commit()
    worker = threading.Thread(target=_drain, args=(engine, 4))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        rows: list[Any] = []
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                rows = conn.execute(text(
                    "SELECT lease_token, worker_id FROM postjob.jobs WHERE status = 'processing'"
                )).all()
            if len(rows) == 4:
                break
            time.sleep(0.02)
        assert len(rows) == 4
        assert all(r[0] is not None for r in rows)  # each one fenced
        assert len({r[1] for r in rows}) == 1  # one worker
        with Session(engine) as s:
            JobQueue(s, registry=reg).cancel(ids[0])
            s.commit()
    finally:
        gate.set()
        worker.join(20)
    with engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status::text FROM postjob.jobs")).all())
    assert statuses == {ids[0]: "cancelled", **{i: "ok" for i in ids[1:]}}


def test_an_async_fan_out_runs_each_child_once(engine: Engine, clean: None) -> None:
    RUNS.clear()
    with Session(engine) as s:
        parent = JobQueue(s, registry=reg).enqueue(fanout, 200).id
        s.commit()
    for _ in range(10):
        if not _drain(engine, concurrency=20):
            break
    with engine.connect() as conn:
        status, results, note = conn.execute(text(
            "SELECT status::text, results, workflow_status FROM postjob.jobs WHERE id = :i"),
            {"i": parent}).one()
    assert (status, results, note) == ("ok", [sum(i * i for i in range(200))], "200 children")
    assert RUNS == Counter(range(200))


def test_an_async_workflow_gathers_its_children(engine: Engine, clean: None) -> None:
    """Issue 24 item 10: ``await asyncio.gather(*handles)`` (gather puts its awaitables in a
    dict: a handle must be hashable); the parent sleeps on the first pass and gathers the
    results on the next."""
    RUNS.clear()
    with Session(engine) as s:
        parent = JobQueue(s, registry=reg).enqueue(gathered, 5).id
        s.commit()
    for _ in range(5):
        if not _drain(engine, concurrency=4):
            break
    with engine.connect() as conn:
        status, results, error = conn.execute(text(
            "SELECT status::text, results, error_message FROM postjob.jobs WHERE id = :i"),
            {"i": parent}).one()
    assert (status, error) == ("ok", None)
    assert results == [{"results": [0, 1, 4, 9, 16, 0], "distinct": 5, "same": True}]
    assert RUNS == Counter(range(5))


def test_an_async_manual_step(engine: Engine, clean: None) -> None:
    TOKENS.clear()
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        parent = q.enqueue(approval).id
        s.commit()
        assert _drain(engine, concurrency=2) == 1  # asleep, waiting for the token
        q.resolve(TOKENS[0], "yes")
        s.commit()
        assert _drain(engine, concurrency=2) == 1
        s.expire_all()
        job = s.get(postjob_sa.Job, parent)
        assert job is not None and job.result() == "yes"


txreg = Registry()


@postjob_sa.workflow(name="cc.tx", transactional=True, registry=txreg)
async def tx_async(session: AsyncSession, value: int, fail: bool) -> int:
    await session.execute(text("INSERT INTO cc_side (value) VALUES (:v)"), {"v": value})
    await session.rollback()  # its own savepoint: the checkout stays
    await session.execute(text("INSERT INTO cc_side (value) VALUES (:v)"), {"v": value + 100})
    assert postjob_sa.current_session() is session
    if fail:
        raise RuntimeError("roll me back")
    return value


def test_a_transactional_async_workflow_gets_an_async_session_in_the_checkouts_transaction(
    engine: Engine, clean: None
) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS cc_side (value int)"))
        conn.execute(text("TRUNCATE cc_side"))
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True, registry=txreg)
        good = q.enqueue(tx_async, 1, False).id
        bad = q.enqueue(tx_async, 2, True, max_attempts=1).id
        s.commit()
        assert q.drain() == 2
    with engine.connect() as conn:
        values = [r[0] for r in conn.execute(text("SELECT value FROM cc_side"))]
        statuses = dict(conn.execute(text("SELECT id, status::text FROM postjob.jobs")).all())
    assert values == [101]
    assert statuses == {good: "ok", bad: "failed"}


@postjob_sa.workflow(name="cc.blocker", registry=reg)
async def blocker(seconds: float) -> str:
    with _lock:
        RUNS[postjob_sa.current_job().id] += 1
    time.sleep(seconds)  # a blocking call on the event loop: the mistake this test is about
    return "unblocked"


@postjob_sa.workflow(name="cc.polite", registry=reg)
async def polite() -> str:
    with _lock:
        RUNS[postjob_sa.current_job().id] += 1
    await asyncio.sleep(0.1)
    return "done"


def test_a_job_blocking_the_event_loop_costs_the_others_nothing(
    engine: Engine, clean: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The event loop is blocked for 3 s, three times the lease: the heartbeat (a thread of its
    own) keeps every lease, so a second worker takes none of them; the watchdog says why."""
    RUNS.clear()
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        ids = [q.enqueue(blocker, 3.0).id] + [q.enqueue(polite).id for _ in range(3)]
        s.commit()
    stop = threading.Event()

    def rescuer() -> None:
        with Session(engine) as s:
            other = JobQueue(s, fast_mode=True, registry=reg, lease=1.0)
            while not stop.is_set():
                other.drain()
                time.sleep(0.1)

    second = threading.Thread(target=rescuer)
    with caplog.at_level(logging.WARNING, logger="postjob_sa.worker"):
        worker = threading.Thread(target=_drain, args=(engine, 4, 1.0))
        worker.start()
        time.sleep(0.3)  # the first worker has them all
        second.start()
        worker.join(30)
        stop.set()
        second.join(30)
    assert RUNS == Counter(ids)  # each ran once
    assert "the event loop of async jobs has not answered" in caplog.text
