"""Cancellation: before a start, of a tree, of a running job (the workflow is told and may
clean up), and what a waiting parent sees."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import (
    ChildFailed,
    InvalidJobState,
    JobCancelled,
    JobNotFound,
    JobQueue,
    Registry,
    Status,
    manual,
    set_workflow_status,
)
from tests.cli.test_cli_db import postjob
from tests.conftest import url_string

reg = Registry()
STARTED = threading.Event()
CLEANED: list[int] = []


@postjob_sa.workflow(name="cx.leaf", registry=reg)
def leaf(x: int) -> int:
    return x


@postjob_sa.workflow(name="cx.parent", registry=reg)
def parent(n: int) -> list[Any]:
    steps = [manual("approve", i) for i in range(n)]
    done = leaf.spawn(0)
    return [done.result()] + [s.result() for s in steps]


@postjob_sa.workflow(name="cx.catcher", registry=reg)
def catcher() -> str:
    child = manual("approve")
    try:
        return str(child.result())
    except ChildFailed as exc:
        return f"child {exc.status}"


@postjob_sa.workflow(name="cx.pair", registry=reg)
def pair() -> list[Any]:
    first, second = manual("first"), manual("second")
    return [first.result(), second.result()]


@postjob_sa.workflow(name="cx.busy", registry=reg)
def busy() -> str:
    """Works in a loop, noting its progress (a fenced write) until it is cancelled."""
    STARTED.set()
    try:
        for i in range(2000):
            set_workflow_status(f"step {i}")
            time.sleep(0.01)
    except JobCancelled as exc:
        CLEANED.append(exc.job_id)
        raise
    return "finished"


@postjob_sa.workflow(name="cx.quiet", registry=reg)
def quiet() -> str:
    """Spawns once, then loops without writing: only the heartbeat can tell it."""
    child = leaf.spawn(1)
    STARTED.set()
    try:
        for _ in range(3000):
            leaf.spawn(1)  # known already: no round trip, but the lost-lease check
            time.sleep(0.01)
    except JobCancelled as exc:
        CLEANED.append(exc.job_id)
        raise
    return str(child.id)


def _q(session: Session, **kw: Any) -> JobQueue:
    return JobQueue(session, fast_mode=True, registry=reg, **kw)


def _status(engine: Engine, job_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                                {"i": job_id}).scalar_one())


def test_a_job_not_started_is_cancelled_at_once(engine: Engine, session: Session) -> None:
    q = _q(session)
    job = q.enqueue(leaf, 1)
    session.commit()
    assert q.cancel(job.id) == [job.id]
    session.commit()
    assert _status(engine, job.id) == "cancelled"
    assert q.checkout() == []
    assert Status.cancelled.is_final
    with pytest.raises(InvalidJobState, match="already cancelled"):
        q.cancel(job.id)
    with pytest.raises(JobNotFound):
        q.cancel(10**9)


def test_a_tree_is_cancelled_with_its_unfinished_descendants(engine: Engine, session: Session) -> None:
    q = _q(session)
    root = q.enqueue(parent, 2)
    session.commit()
    q.drain()  # the root sleeps; its leaf child ran; two manual steps wait
    q.drain()
    with engine.connect() as conn:
        before = dict(conn.execute(text(
            "SELECT id, status::text FROM postjob.jobs ORDER BY id")).all())
    assert sorted(before.values()) == ["ok", "ready", "ready", "sleep"]
    cancelled = q.cancel(root.id)
    session.commit()
    assert cancelled[0] == root.id
    assert sorted(cancelled) == sorted(i for i, s in before.items() if s != "ok")
    with engine.connect() as conn:
        after = dict(conn.execute(text(
            "SELECT id, status::text FROM postjob.jobs ORDER BY id")).all())
    assert sorted(after.values()) == ["cancelled", "cancelled", "cancelled", "ok"]
    # reset brings the whole tree back
    assert sorted(q.reset(root.id)) == sorted(cancelled)


def test_a_parent_waiting_on_a_cancelled_child_sees_child_failed(
    engine: Engine, session: Session
) -> None:
    q = _q(session)
    root = q.enqueue(catcher)
    session.commit()
    q.drain()
    with engine.connect() as conn:
        child_id = conn.execute(text("SELECT id FROM postjob.jobs WHERE parent_id = :p"),
                                {"p": root.id}).scalar_one()
    assert _status(engine, root.id) == "sleep"
    q.cancel(child_id)
    session.commit()
    assert _status(engine, root.id) == "ready"  # woken at once
    q.drain()
    with engine.connect() as conn:
        results = conn.execute(text("SELECT results FROM postjob.jobs WHERE id = :i"),
                               {"i": root.id}).scalar_one()
    assert results == ["child cancelled"]


def test_a_cancelled_sibling_wakes_a_parent_waiting_for_another_child(
    engine: Engine, session: Session
) -> None:
    q = _q(session)
    root = q.enqueue(pair)
    session.commit()
    q.drain()
    with engine.connect() as conn:
        second = conn.execute(text("SELECT id FROM postjob.jobs WHERE parent_id = :p "
                                   "AND args->>1 IS NULL AND args->>0 = 'second'"),
                              {"p": root.id}).scalar_one()
    assert _status(engine, root.id) == "sleep"  # waiting for the first
    q.cancel(second)
    session.commit()
    assert _status(engine, root.id) == "ready"  # woken, as by a failed child


def _work_in_thread(engine: Engine, **kw: Any) -> threading.Thread:
    def run() -> None:
        with Session(engine) as s:
            _q(s, **kw).work(count=1)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("workflow", [busy, quiet], ids=["fenced-write", "heartbeat"])
def test_a_running_job_is_told_and_ends_cancelled(
    engine: Engine, session: Session, workflow: Any
) -> None:
    STARTED.clear()
    CLEANED.clear()
    q = _q(session)
    job = q.enqueue(workflow)
    session.commit()
    worker = _work_in_thread(engine, lease=1.5)  # a beat every 0.5 s
    assert STARTED.wait(timeout=30)
    assert _status(engine, job.id) == "processing"
    q.cancel(job.id)
    session.commit()
    assert _status(engine, job.id) == "cancelled"
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert CLEANED == [job.id]  # the workflow saw JobCancelled and cleaned up
    assert _status(engine, job.id) == "cancelled"  # the run's outcome was not recorded


def test_postjob_job_cancel(db_url: Any, engine: Engine, session: Session) -> None:
    q = _q(session)
    job = q.enqueue(leaf, 1)
    session.commit()
    res = postjob("job", "cancel", str(job.id), url=url_string(db_url))
    assert res.returncode == 0, res.stderr
    assert f"cancelled 1 job(s): {job.id}" in res.stdout
    again = postjob("job", "cancel", str(job.id), url=url_string(db_url))
    assert again.returncode == 2 and "already cancelled" in again.stderr


# -- a cancel that meets a spawn (review of round 2) --------------------------------------------

@postjob_sa.workflow(name="cx.spawner", registry=reg)
def spawner(n: int) -> list[int]:
    children = [leaf.spawn(i) for i in range(n)]
    return [c.result() for c in children]


SLOW_CHILDREN = """
CREATE FUNCTION postjob._test_slow_children() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.workflow = 'cx.leaf' AND NEW.parent_id IS NOT NULL THEN
    PERFORM pg_sleep(0.3);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER test_slow_children BEFORE INSERT ON postjob.postjobs
  FOR EACH ROW EXECUTE FUNCTION postjob._test_slow_children();
"""
SLOW_CHILDREN_DOWN = ("DROP TRIGGER test_slow_children ON postjob.postjobs; "
                      "DROP FUNCTION postjob._test_slow_children()")


def test_a_cancel_during_a_spawn_cancels_the_children_it_inserts(
    engine: Engine, clean: None
) -> None:
    """The children a run is inserting when the cancel comes are cancelled with their parent
    (the cancel waits for the spawn, then reads the descendants), and no worker runs them."""
    with engine.begin() as conn:
        conn.exec_driver_sql(SLOW_CHILDREN)
    try:
        with Session(engine) as s:
            root = JobQueue(s, registry=reg).enqueue(spawner, 3).id
            s.commit()
        worker = threading.Thread(
            target=lambda: JobQueue(Session(engine), registry=reg, fast_mode=True).step())
        worker.start()
        deadline = time.monotonic() + 10
        with engine.connect() as conn:
            while time.monotonic() < deadline and not conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                    "AND query LIKE '%spawn_children%' AND pid <> pg_backend_pid()")).scalar():
                time.sleep(0.01)
                conn.rollback()
        with Session(engine) as s:
            JobQueue(s, registry=reg).cancel(root)
            s.commit()
        worker.join(20)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(SLOW_CHILDREN_DOWN)
    with engine.connect() as conn:
        children = conn.execute(text(
            "SELECT status::text FROM postjob.jobs WHERE parent_id = :r"), {"r": root}
        ).scalars().all()
    assert children and set(children) == {"cancelled"}, children
    assert JobQueue(Session(engine), registry=reg, fast_mode=True).drain() == 0
