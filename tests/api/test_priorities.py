"""Priorities (higher first, then earliest due) and unique keys (one unfinished job per key)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, InvalidJobState, Job, JobQueue, Registry, Status

reg = Registry()


@postjob_sa.workflow(name="pr.a", registry=reg)
def a(x: int) -> int:
    return x


@postjob_sa.workflow(name="pr.b", registry=reg)
def b(x: int) -> int:
    return x


def _q(session: Session) -> JobQueue:
    return JobQueue(session, fast_mode=True, registry=reg)


def test_higher_priority_first_then_earliest_due(session: Session) -> None:
    q = _q(session)
    past = datetime.now(UTC) - timedelta(minutes=5)
    low_old = q.enqueue(a, 1, run_at=past).id
    high = q.enqueue(b, 2, priority=5).id
    high_old = q.enqueue(a, 3, priority=5, run_at=past).id
    negative = q.enqueue(b, 4, priority=-1, run_at=past).id
    q.enqueue(a, 5, priority=100, run_at=datetime.now(UTC) + timedelta(hours=1))  # not due
    session.commit()
    order = []
    while jobs := q.checkout():
        order.append(jobs[0].id)
        session.commit()
    assert order == [high_old, high, low_old, negative]


def test_a_batch_is_taken_in_priority_order_across_workflows_and_queues(session: Session) -> None:
    q = _q(session)
    ids = {p: q.enqueue(a if p % 2 else b, p, priority=p, queue=f"q{p % 3}").id for p in range(9)}
    session.commit()
    jobs = q.checkout(limit=4)
    assert sorted((j.id for j in jobs), key=lambda i: -[p for p, x in ids.items() if x == i][0]) \
        == [ids[8], ids[7], ids[6], ids[5]]


def test_concurrent_checkouts_take_the_highest_priorities_first(engine: Engine, clean: None) -> None:
    """Eight threads check out one job at a time, holding each until all have one: the eight
    jobs taken first are the eight highest priorities, none twice."""
    with Session(engine) as s:
        q = _q(s)
        for p in range(40):
            q.enqueue(a, p, priority=p)
        s.commit()
    barrier = threading.Barrier(8)
    got: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        with Session(engine) as s:
            jobs = _q(s).checkout()
            with lock:
                got.extend(j.priority for j in jobs)
            barrier.wait(timeout=30)  # every thread holds its job while the others take theirs
            s.rollback()

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(got, reverse=True) == list(range(39, 31, -1))


def test_priority_is_validated_before_anything_is_written(session: Session) -> None:
    q = _q(session)
    for bad in ("high", 1.5, True, 10**7):
        with pytest.raises(InvalidArgument):
            q.enqueue(a, 1, priority=bad)  # type: ignore[arg-type]
    assert session.execute(text("SELECT count(*) FROM postjob.jobs")).scalar() == 0


def test_enqueue_many_takes_a_priority(session: Session) -> None:
    q = _q(session)
    q.enqueue_many(a, [[1], [2]])
    urgent = q.enqueue_many(a, [[3]], priority=9)
    session.commit()
    assert [j.id for j in q.checkout()] == urgent


# -- unique keys ------------------------------------------------------------------------------


def test_a_unique_key_held_by_an_unfinished_job_returns_that_job(session: Session) -> None:
    q = _q(session)
    first = q.enqueue(a, 1, unique_key="report:2026-12")
    again = q.enqueue(a, 2, unique_key="report:2026-12")
    assert again.id == first.id and again.args == [1]
    other = q.enqueue(a, 1, unique_key="report:2027-01")
    assert other.id != first.id
    session.commit()
    [job] = q.checkout(workflows=["pr.a"])
    q.complete(job, 1)
    session.commit()
    # finished: the key is free again
    fresh = q.enqueue(a, 3, unique_key="report:2026-12")
    assert fresh.id not in (first.id, other.id)


def test_eight_threads_enqueue_one_key_and_get_one_job(engine: Engine, clean: None) -> None:
    barrier = threading.Barrier(8)
    ids: list[int] = []
    usable: list[bool] = []
    lock = threading.Lock()

    def enqueue(i: int) -> None:
        with Session(engine) as s:
            barrier.wait(timeout=30)
            job = _q(s).enqueue(a, i, unique_key="once")
            # the caller's transaction is still usable after a conflict
            ok = s.execute(text("SELECT 1")).scalar() == 1
            s.commit()
            with lock:
                ids.append(job.id)
                usable.append(ok)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(ids) == 8 and len(set(ids)) == 1 and all(usable)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM postjob.jobs")).scalar() == 1


def test_the_unique_index_refuses_a_second_unfinished_holder(session: Session) -> None:
    """The database decides, not a look-up before the insert: a plain insert of a second
    holder fails."""
    session.add(Job(workflow="pr.a", args=[1], unique_key="k"))
    session.flush()
    session.add(Job(workflow="pr.a", args=[2], unique_key="k"))
    with pytest.raises(Exception, match="unfinished_unique_key_idx"):
        session.flush()
    session.rollback()
    session.add(Job(workflow="pr.a", args=[1], unique_key="k", status=Status.ok, next_run_at=None))
    session.add(Job(workflow="pr.a", args=[2], unique_key="k"))
    session.flush()  # a finished job does not hold its key


def _finished_holder_and_newer(engine: Engine, key: str) -> tuple[int, int]:
    """A failed job that held ``key`` and the newer unfinished job that holds it now."""
    with Session(engine) as s:
        q = _q(s)
        old = q.enqueue(a, 1, unique_key=key).id
        [held] = q.checkout([a.name])
        q.fail(held, RuntimeError("gone"), retry=False)  # failed: the key is free again
        newer = q.enqueue(a, 2, unique_key=key).id
        s.commit()
    assert newer != old
    return old, newer


def test_reset_of_a_job_whose_unique_key_a_newer_job_holds_names_the_holder(
    engine: Engine, session: Session
) -> None:
    """Issue 24 item 6: a clear InvalidJobState, nothing reset, the caller's transaction usable
    (its own earlier write commits)."""
    old, newer = _finished_holder_and_newer(engine, "report:2026-12")
    q = _q(session)
    mine = q.enqueue(b, "mine").id
    with pytest.raises(InvalidJobState) as caught:
        q.reset(old)
    assert str(caught.value) == (
        f"job {old} cannot be reset: its unique key 'report:2026-12' is held by unfinished job "
        f"{newer}; cancel or finish job {newer} first"
    )
    assert session.execute(text("SELECT 1")).scalar() == 1  # the transaction is usable
    session.commit()
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT id, status::text FROM postjob.jobs")).all())
    assert rows == {old: "failed", newer: "ready", mine: "ready"}


def test_reset_of_a_tree_whose_failed_child_lost_its_unique_key_names_the_holder(
    engine: Engine, session: Session
) -> None:
    """The conflict may be a descendant's, which reset brings back with its ancestor."""
    with Session(engine) as s:
        q = _q(s)
        root = q.enqueue(a, 0).id
        child = q.enqueue(b, 1, parent_id=root, unique_key="child-key").id
        s.commit()
        for name in (b.name, a.name):  # the child fails, then its parent
            [held] = q.checkout([name])
            q.fail(held, RuntimeError("gone"), retry=False)
        holder = q.enqueue(b, 2, unique_key="child-key").id
        s.commit()
    with pytest.raises(InvalidJobState, match=f"job {child} cannot be reset: its unique key "
                       f"'child-key' is held by unfinished job {holder}"):
        _q(session).reset(root)
    session.commit()
    with engine.connect() as conn:
        statuses = conn.execute(text("SELECT status::text FROM postjob.jobs ORDER BY id")).scalars().all()
    assert statuses == ["failed", "failed", "ready"]


def test_a_bad_unique_key_is_refused(session: Session) -> None:
    with pytest.raises(InvalidArgument, match="unique_key"):
        _q(session).enqueue(a, 1, unique_key="")
