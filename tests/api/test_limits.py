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
        # the limited jobs end only once the free queue's have: its workers were not held back
        q.enqueue_many("fx.after_queue", [["free", 0.15]] * 16, queue="limited")
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
                "FROM postjob.jobs")).one()
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
            "SELECT processing_started_at FROM postjob.jobs "
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


def test_a_limit_takes_its_places_and_starts_with_it(session: Session) -> None:
    """A queue's places and starts go with its limit (by a trigger: no foreign key, whose
    check would lock the limit after the places), and all of them with a TRUNCATE."""
    q = _q(session)
    q.set_queue_limits("a", concurrency=3, rate=2)
    q.set_queue_limits("b", concurrency=1)
    session.commit()
    permits = text("SELECT (SELECT count(*) FROM postjob.queue_slots WHERE queue = :q) "
                   "+ (SELECT count(*) FROM postjob.queue_starts WHERE queue = :q)")
    assert session.execute(permits, {"q": "a"}).scalar_one() == 5
    q.set_queue_limits("a")
    session.commit()
    assert session.execute(permits, {"q": "a"}).scalar_one() == 0
    assert session.execute(permits, {"q": "b"}).scalar_one() == 1
    session.execute(text("TRUNCATE postjob.queue_limits"))
    session.commit()
    assert session.execute(permits, {"q": "b"}).scalar_one() == 0


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


# -- the defects review found in round 2 (each failed before its fix) --------------------------

def test_a_longer_period_never_stalls_the_queue(engine: Engine, session: Session) -> None:
    """Starts are times, not counts by a slot of the period: after three starts under a 0.2 s
    period, a 0.4 s period lets the queue start again once they are 0.4 s old."""
    q = _q(session)
    q.set_queue_limits("r", rate=3, period=0.2)
    q.enqueue_many(slow, [[0]] * 6, queue="r")
    session.commit()
    assert len(q.checkout(limit=6)) == 3
    session.commit()
    q.set_queue_limits("r", rate=3, period=0.4)
    session.commit()
    assert q.checkout(limit=6) == []  # the three starts are recent under the new period too
    session.rollback()
    time.sleep(0.45)
    assert len(q.checkout(limit=6)) == 3
    session.commit()


def test_changing_or_removing_a_limit_never_stalls_the_queue(session: Session) -> None:
    q = _q(session)
    q.set_queue_limits("c", concurrency=1, rate=1, period=3600)
    q.enqueue_many(slow, [[0]] * 4, queue="c")
    session.commit()
    assert len(q.checkout(limit=4)) == 1
    session.commit()
    q.set_queue_limits("c", concurrency=2, rate=2, period=3600)  # one more of each
    session.commit()
    assert len(q.checkout(limit=4)) == 1
    session.commit()
    q.set_queue_limits("c")  # unlimited again
    session.commit()
    assert len(q.checkout(limit=4)) == 2
    session.commit()


def test_a_period_below_a_millisecond_is_refused(session: Session) -> None:
    q = _q(session)
    for period in (1e-9, 0.0009, 0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidArgument, match="period"):
            q.set_queue_limits("p", rate=1, period=period)
    assert q.queue_limits() == []  # nothing written, the transaction usable
    q.set_queue_limits("p", rate=1, period=0.001)
    assert [limit.period for limit in q.queue_limits()] == [0.001]


def test_the_cli_refuses_a_tiny_period_in_one_line(db_url: URL, clean: None) -> None:
    assert_bad_input(postjob("--database-url", url_string(db_url), "queue", "limit", "p",
                             "--rate", "1", "--per", "0.000000001"), "period")


def test_a_checkout_never_fails_because_of_a_stored_limit(engine: Engine, session: Session) -> None:
    """Whatever a row holds (written by hand, or by older code), checkout works."""
    q = _q(session)
    q.enqueue_many(slow, [[0]] * 3, queue="odd")
    session.commit()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO postjob.queue_limits (queue, rate, period) "
                          "VALUES ('odd', 2, 1e-9)"))
    assert len(q.checkout(limit=3)) == 2
    session.commit()
    with engine.begin() as conn:
        conn.execute(text("UPDATE postjob.queue_limits SET period = 1e300 WHERE queue = 'odd'"))
    assert q.checkout(limit=3) == []
    session.commit()


@postjob_sa.workflow(name="fx.tx_held", transactional=True, registry=reg)
def tx_held(session: Session, key: int) -> int:
    _running.wait(key)
    return key


class _Meeting:
    """How many transactional jobs are inside their run at once (the most seen)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.inside = 0
        self.most = 0
        self.release = threading.Event()

    def wait(self, key: int) -> None:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.lock.notify_all()
        self.release.wait(20)
        with self.lock:
            self.inside -= 1


_running = _Meeting()


def test_a_limit_lets_that_many_transactional_jobs_run_at_once(
    engine: Engine, session: Session
) -> None:
    """Concurrency 3: three transactional jobs run side by side (each checkout's transaction
    lasts as long as its job), never a fourth."""
    global _running
    _running = _Meeting()
    q = _q(session)
    q.set_queue_limits("tx", concurrency=3)
    q.enqueue_many(tx_held, [[i] for i in range(5)], queue="tx")
    session.commit()

    def work() -> None:
        with Session(engine) as s:
            _q(s).step(transactional=True)

    threads = [threading.Thread(target=work) for _ in range(5)]
    for thread in threads:
        thread.start()
    with _running.lock:
        _running.lock.wait_for(lambda: _running.inside >= 3, timeout=15)
        three = _running.inside
    time.sleep(0.3)  # a fourth would be inside by now
    most = _running.most
    _running.release.set()
    for thread in threads:
        thread.join(30)
    assert (three, most) == (3, 3)


def test_a_limited_queue_at_its_share_leaves_the_batch_to_the_others(session: Session) -> None:
    """Queue a (one at a time) has due jobs at several priorities above queue b's: a batch of
    three is a's best and two of b's."""
    q = _q(session)
    q.set_queue_limits("a", concurrency=1)
    best = q.enqueue(slow, 1, queue="a", priority=9).id
    q.enqueue(slow, 2, queue="a", priority=8)
    q.enqueue(slow, 3, queue="a", priority=7)
    b = q.enqueue_many(slow, [[4], [5], [6]], queue="b")
    session.commit()
    assert [job.id for job in q.checkout(limit=3)] == [best, *b[:2]]
    session.commit()


RUN_GOES_ON = threading.Event()
RUN_STARTED = threading.Event()


@postjob_sa.workflow(name="fx.unaware", registry=reg)
def unaware() -> str:
    """A run that does not look at the database while it works (it learns of a cancel only at
    its worker's next heartbeat, or when it ends)."""
    RUN_STARTED.set()
    assert RUN_GOES_ON.wait(30)
    return "done"


def test_a_cancelled_job_keeps_its_place_while_its_run_goes_on(engine: Engine, session: Session) -> None:
    """Concurrency 1: the job that runs is cancelled; until its run has stopped, the next job
    of the queue does not start (the limit holds, not 'at most 1 more for a heartbeat')."""
    from postjob_sa.worker.loop import Worker
    from postjob_sa.worker.options import WorkerOptions

    RUN_GOES_ON.clear()
    RUN_STARTED.clear()
    q = _q(session)
    q.set_queue_limits("one", concurrency=1)
    running = q.enqueue(unaware, queue="one")
    session.commit()
    worker = Worker(engine, reg, WorkerOptions(fast_mode=True, handle_signals=False, lease=30,
                                               count=1, workflows=["fx.unaware"]))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert RUN_STARTED.wait(30)
        next_one = q.enqueue(slow, 0, queue="one")
        q.cancel(running.id)
        session.commit()
        with Session(engine) as other:
            assert _q(other).checkout(queues=["one"]) == [], \
                "the next job started while the cancelled job's run goes on"
            other.rollback()
    finally:
        RUN_GOES_ON.set()
        thread.join(30)
    assert not thread.is_alive()
    with Session(engine) as other:  # the run has stopped: its place is free
        assert [j.id for j in _q(other).checkout(queues=["one"])] == [next_one.id]
        other.rollback()
