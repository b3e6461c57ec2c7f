"""Checkout: SKIP LOCKED in the caller's transaction, version pairs, queues, leases."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidJobState, Job, JobQueue, Registry, Status

pytestmark = pytest.mark.both_drivers

reg = Registry()


@postjob_sa.workflow(name="co.a", registry=reg)
def a(x: int) -> int:
    return x


@postjob_sa.workflow(name="co.v2", version="2.0", registry=reg)
def v2() -> str:
    return "two"


def _q(session: Session) -> JobQueue:
    return JobQueue(session, fast_mode=True, registry=reg)


def test_checkout_holds_the_job_until_commit_and_rollback_returns_it(engine: Engine, session: Session) -> None:
    q = _q(session)
    q.enqueue(a, 1)
    session.commit()
    jobs = q.checkout()
    assert len(jobs) == 1 and jobs[0].status is Status.processing
    assert jobs[0].lease_token is not None and jobs[0].lease_expires_at is not None
    with Session(engine) as other:
        other.execute(text("SET lock_timeout = '2s'"))  # blocked fails, not hangs
        assert _q(other).checkout() == []  # locked, skipped, not blocked
    session.rollback()
    with Session(engine) as other:
        again = _q(other).checkout()
        assert [j.id for j in again] == [jobs[0].id]
        other.rollback()


def test_two_sessions_never_get_the_same_job_and_do_not_block(engine: Engine, session: Session) -> None:
    q = _q(session)
    q.enqueue_many(a, [[i] for i in range(20)])
    session.commit()
    s1, s2 = Session(engine), Session(engine)
    try:
        s2.execute(text("SET lock_timeout = '2s'"))  # waiting on s1's jobs fails, not hangs
        got1 = {j.id for j in _q(s1).checkout(limit=15)}
        got2 = {j.id for j in _q(s2).checkout(limit=15)}  # returns at once: 5 left
        assert len(got1) == 15 and len(got2) == 5 and not got1 & got2
    finally:
        s1.rollback(), s2.rollback()
        s1.close(), s2.close()


def test_concurrent_checkout_from_threads_hands_out_each_job_once(engine: Engine, session: Session) -> None:
    q = _q(session)
    q.enqueue_many(a, [[i] for i in range(300)])
    session.commit()
    seen: list[int] = []
    lock = threading.Lock()

    def grab() -> None:
        with Session(engine) as s:
            while True:
                jobs = _q(s).checkout(limit=7)
                if not jobs:
                    break
                for j in jobs:
                    _q(s).complete(j, j.args[0])
                s.commit()
                with lock:
                    seen.extend(j.id for j in jobs)

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 300 and len(set(seen)) == 300


def test_only_registered_workflow_version_pairs_are_checked_out(session: Session) -> None:
    q = _q(session)
    unknown = q.enqueue("co.unknown")
    pinned_other = q.enqueue(v2, version="1.0")
    pinned_same = q.enqueue(v2, version="2.0")
    unpinned = q.enqueue(v2)
    session.commit()
    got = {j.id for j in q.checkout(limit=10)}
    assert got == {pinned_same.id, unpinned.id}
    assert unknown.id not in got and pinned_other.id not in got
    session.rollback()
    assert {j.id for j in q.checkout(workflows=["co.a"], limit=10)} == set()
    session.rollback()


def test_queue_filter(session: Session) -> None:
    q = _q(session)
    x = q.enqueue(a, 1, queue="x")
    q.enqueue(a, 2, queue="y")
    session.commit()
    assert [j.id for j in q.checkout(queues=["x"], limit=5)] == [x.id]
    session.rollback()


def test_version_is_stamped_and_pins_re_runs(session: Session) -> None:
    q = _q(session)
    job = q.enqueue(v2)
    session.commit()
    assert q.drain() == 1
    session.refresh(job)
    assert job.status is Status.ok and job.workflow_version == "2.0" and job.result() == "two"


def test_complete_and_fail_in_the_callers_transaction(session: Session) -> None:
    q = _q(session)
    _j1, _j2 = q.enqueue(a, 1), q.enqueue(a, 2)
    session.commit()
    first, second = q.checkout(limit=2)
    q.complete(first, {"done": True})
    q.fail(second, ValueError("nope"), retry=False)
    session.commit()
    session.refresh(first), session.refresh(second)
    assert first.status is Status.ok and first.result() == {"done": True}
    assert second.status is Status.failed and second.error_message == "nope"
    with pytest.raises(InvalidJobState):
        q.complete(first, 1)  # no longer checked out under that lease
    session.rollback()


def test_rolled_back_completion_leaves_the_job_processing_under_its_lease(engine: Engine, session: Session) -> None:
    q = _q(session)
    q.enqueue(a, 1)
    session.commit()
    (job,) = q.checkout()
    session.commit()  # lease mode: the checkout is committed
    q.complete(job, 1)
    session.rollback()
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status::text FROM postjob.jobs")).scalar()
    assert status == "processing"


def test_checkout_rejects_bad_limits(session: Session) -> None:
    q = _q(session)
    for bad in (0, -1, 10**6, "3", True):
        with pytest.raises(postjob_sa.InvalidArgument):
            q.checkout(limit=bad)  # type: ignore[arg-type]
    assert isinstance(q.checkout(), list)


def test_processing_rows_show_the_worker(session: Session) -> None:
    q = JobQueue(session, registry=reg, identifier="box:123")
    job = q.enqueue(a, 1)
    session.commit()
    session.execute(text("SELECT postjob.set_client_identifier('box:123')"))
    (got,) = q.checkout()
    assert got.processing_client_identifier == "box:123"
    url = session.get_bind().url
    if url.host and "host" not in url.query:  # TCP: address:port; unix socket: NULL
        assert got.processing_client is not None and ":" in got.processing_client
    else:
        assert got.processing_client is None
    assert got.processing_started_at is not None and got.processing_max_duration == 60
    session.rollback()
    assert isinstance(job, Job)


def test_a_checkout_in_the_callers_transaction_locks_only_the_job_it_hands_out(
        engine: Engine, session: Session) -> None:
    """Jobs whose time has come but that no worker has made due yet: the app's checkout takes
    one and holds it until it commits; the others stay free for the workers meanwhile."""
    q = _q(session)
    soon = datetime.now(UTC) + timedelta(seconds=0.3)
    ids = [q.enqueue(a, i, run_at=soon).id for i in range(5)]
    session.commit()
    time.sleep(0.5)  # their time has come
    (held,) = q.checkout()  # the app's transaction stays open
    with Session(engine) as other:
        other.execute(text("SET lock_timeout = '5s'"))  # a wait for the app fails, not hangs
        ran = _q(other).drain()
    assert ran == 4, f"a worker ran {ran} of the 4 jobs the app does not hold"
    session.rollback()
    assert held.id in ids
