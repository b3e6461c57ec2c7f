"""Per-queue limits: at most N processing across worker processes, at most M starts in any
period, unlimited queues unaffected, set by the API and the CLI."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, JobQueue, Registry
from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.conftest import url_string
from tests.reliability.conftest import WorkerProcess, wait_for, workers  # noqa: F401

reg = Registry()


@postjob_sa.workflow(name="fx.slow", registry=reg)
def slow(seconds: float) -> float:
    return seconds


def _q(session: Session) -> JobQueue:
    return JobQueue(session, fast_mode=True, registry=reg)


def _count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


@pytest.mark.slow
def test_concurrency_limit_holds_across_four_worker_processes(
    db_url: URL, engine: Engine, clean: None, workers: Callable[..., WorkerProcess]  # noqa: F811
) -> None:
    with Session(engine) as s:
        q = _q(s)
        q.set_queue_limits("limited", concurrency=2)
        q.enqueue_many(slow, [[0.15]] * 16, queue="limited")
        q.enqueue_many(slow, [[0.05]] * 16, queue="free")
        s.commit()
    procs = [workers(db_url, "--import", "tests.features_app") for _ in range(4)]
    most = 0
    limited_left_when_free_done = None
    deadline = time.monotonic() + 120
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while True:  # sample the table continuously until every job is done
            row = conn.execute(text(
                "SELECT count(*) FILTER (WHERE queue = 'limited' AND status = 'processing'), "
                "count(*) FILTER (WHERE queue = 'limited' AND status <> 'ok'), "
                "count(*) FILTER (WHERE queue = 'free' AND status <> 'ok') "
                "FROM postjob.postjobs")).one()
            most = max(most, row[0])
            if row[2] == 0 and limited_left_when_free_done is None:
                limited_left_when_free_done = row[1]
            if row[1] + row[2] == 0:
                break
            assert time.monotonic() < deadline, [p.log() for p in procs]
    assert most == 2, most  # the limit was reached and never passed
    # the free queue beside it was not held back: it was done before the limited one
    assert limited_left_when_free_done, limited_left_when_free_done


def test_rate_limit_holds_over_any_window(engine: Engine, clean: None) -> None:
    """Four threads check out as fast as they can for about 3 s; no window of one period
    ever holds more than `rate` starts (by the database's clock)."""
    rate, period = 5, 1.0
    with Session(engine) as s:
        q = _q(s)
        q.set_queue_limits("rated", rate=rate, period=period)
        q.enqueue_many(slow, [[0]] * 200, queue="rated")
        s.commit()
    stop = time.monotonic() + 3.2

    def hammer() -> None:
        with Session(engine) as s:
            while time.monotonic() < stop:
                _q(s).checkout(limit=3)
                s.commit()
                time.sleep(0.005)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    with engine.connect() as conn:
        starts = [r[0].timestamp() for r in conn.execute(text(
            "SELECT processing_started_at FROM postjob.postjobs "
            "WHERE status = 'processing' ORDER BY processing_started_at"))]
    assert len(starts) >= 2 * rate  # it was not simply stopped
    for i, t0 in enumerate(starts):
        in_window = [t for t in starts[i:] if t - t0 < period]
        assert len(in_window) <= rate, (t0, in_window)


def test_a_blocked_queue_does_not_hold_back_the_jobs_beside_it(session: Session) -> None:
    """Same workflow, the paused queue's jobs due first: the others still run."""
    q = _q(session)
    q.set_queue_limits("paused", concurrency=0)
    q.enqueue_many(slow, [[0]] * 50, queue="paused")
    free = q.enqueue_many(slow, [[0]] * 5, queue="free")
    session.commit()
    assert sorted(j.id for j in q.checkout(limit=10)) == free
    session.rollback()
    assert q.drain() == 5
    q.set_queue_limits("paused")  # no limits: the queue runs again
    session.commit()
    assert q.drain() == 50


def test_concurrency_counts_jobs_held_in_other_transactions(engine: Engine, session: Session) -> None:
    q = _q(session)
    q.set_queue_limits("two", concurrency=2)
    q.enqueue_many(slow, [[0]] * 5, queue="two")
    session.commit()
    assert len(q.checkout(limit=5)) == 2  # not committed yet: the queue's row stays locked
    with Session(engine) as other:
        assert _q(other).checkout(limit=5) == []  # skipped, not blocked
    session.commit()
    with Session(engine) as other:
        assert _q(other).checkout(limit=5) == []  # two processing: nothing more
        other.rollback()


def test_a_limit_counts_the_jobs_already_running_when_it_is_set(
    engine: Engine, session: Session
) -> None:
    """The jobs checked out before the limit existed (here, two of them) take places of it as
    it is written, also when the row is written straight through the ORM."""
    q = _q(session)
    q.enqueue_many(slow, [[0]] * 5, queue="late")
    session.commit()
    assert len(q.checkout(limit=2)) == 2
    session.commit()
    session.add(postjob_sa.QueueLimit(queue="late", concurrency=3))
    session.commit()
    with Session(engine) as other:
        assert len(_q(other).checkout(limit=5)) == 1  # 2 running + 1 = 3
        other.commit()
    with Session(engine) as other:
        assert _q(other).checkout(limit=5) == []
        other.rollback()
    taken = _count(engine, "SELECT count(*) FROM postjob.queue_slots "
                           "WHERE queue = 'late' AND job_id IS NOT NULL")
    assert taken == 3


def test_a_finished_job_frees_its_place(session: Session) -> None:
    q = _q(session)
    q.set_queue_limits("one", concurrency=1)
    q.enqueue_many(slow, [[0]] * 3, queue="one")
    session.commit()
    assert q.drain() == 3  # one at a time, each freeing the place for the next
    assert q.checkout() == []


def test_limits_are_set_listed_and_cleared(session: Session) -> None:
    q = _q(session)
    q.set_queue_limits("a", concurrency=3)
    q.set_queue_limits("b", rate=10, period=60)
    session.commit()
    assert [(x.queue, x.concurrency, x.rate, x.period) for x in q.queue_limits()] == [
        ("a", 3, None, 1.0), ("b", None, 10, 60.0)]
    q.set_queue_limits("a")
    assert [x.queue for x in q.queue_limits()] == ["b"]
    for bad in ({"concurrency": -1}, {"rate": 1.5}, {"rate": 2, "period": 0}):
        with pytest.raises(InvalidArgument):
            q.set_queue_limits("c", **bad)


def test_postjob_queue_limit_and_list(db_url: URL, clean: None) -> None:
    url = url_string(db_url)
    res = postjob("queue", "limit", "mail", "--concurrency", "2", "--rate", "100", "--per", "1m",
                  url=url)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "queue mail: at most 2 processing, at most 100 starts per 1m00s"
    listed = postjob("queue", "list", url=url)
    assert "mail" in listed.stdout and "100" in listed.stdout
    assert postjob("queue", "limit", "mail", "--clear", url=url).returncode == 0
    assert "no queue has limits" in postjob("queue", "list", url=url).stdout
    assert_bad_input(postjob("queue", "limit", "mail", url=url), "--concurrency")
    assert_bad_input(postjob("queue", "limit", "mail", "--concurrency", "-1", url=url),
                     "concurrency")
