"""History beside live traffic (issue 37): the rotation decides on what it sees once its locks
are granted, takes them in the order every statement takes them (the record, then a range),
says ``busy`` for a lock it cannot get, and catches up under a steady stream of enqueues and
runs, each step on its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from postjob_sa import Job, JobQueue, RotationReport
from postjob_sa._db import Conn
from postjob_sa.worker.options import WorkerOptions
from postjob_sa.worker.upkeep import Upkeep
from tests.api.test_history import _at, _rotate, fresh, reg, work  # noqa: F401

pytestmark = [pytest.mark.both_drivers, pytest.mark.slow]

ORPHANS = text("SELECT count(*) FROM postjob.unfinished u "
               "WHERE NOT EXISTS (SELECT 1 FROM postjob.postjobs j WHERE j.id = u.job_id)")
ROTATION_WAITS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
    "AND query LIKE '%rotate_history%' AND pid <> pg_backend_pid()")

ROTATION_WAITS_OR_TRIES = text(  # for a lock, or between two tries of one
    "SELECT count(*) FROM pg_stat_activity WHERE (wait_event_type = 'Lock' "
    "OR wait_event = 'PgSleep') AND query LIKE '%rotate_history%' AND pid <> pg_backend_pid()")


def _settle_old(engine: Engine) -> None:
    """Two hours pass (the settles the rotation read are forgotten)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE postjob.postjobs SET updated_at = now() - interval '2 hours'"))
        conn.execute(text("DELETE FROM postjob.history_partitions"))


def _wait_for(engine: Engine, what: Callable[[Any], bool], seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    with engine.connect() as conn:
        while not what(conn):
            assert time.monotonic() < end, "waited in vain"
            time.sleep(0.05)
            conn.rollback()


class Rotation(threading.Thread):
    """A rotation in a thread of its own (its own connection), as the CLI runs it."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.report: RotationReport | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.report = _rotate(self.engine)
        except BaseException as exc:  # reported in the test's thread
            self.error = exc


def _one_settled_job_in_a_closed_range(engine: Engine, *, keep: timedelta | None
                                       ) -> tuple[int, int]:
    """[1,000,000, 1,001,000) holds one settled job, past keep, and is closed; the next range
    an unfinished job. With a keep, the ranges ahead are made already (the next rotation has
    nothing to create). Returns the two jobs."""
    with Session(engine) as s:
        JobQueue(s).set_history(keep=keep, partition_size=1000)
        s.commit()
    _at(engine, 1_000_000)
    _rotate(engine)  # [1,000,000, 1,001,000) and the one after it
    with Session(engine) as s:
        q = JobQueue(s, registry=reg, fast_mode=True)
        job_id = q.enqueue(work, 1).id
        s.commit()
        assert q.drain() == 1
    _at(engine, 1_001_000)
    with Session(engine) as s:  # a job of the next range, unfinished
        other = JobQueue(s, registry=reg).enqueue(work, 2).id
        s.commit()
    if keep is not None:
        _rotate(engine)
    _settle_old(engine)
    return job_id, other


def _reset_while_the_rotation_waits(engine: Engine, job_id: int, read: int | None = None
                                    ) -> tuple[Rotation, list[int]]:
    """An app's transaction reads a job (its Session loads ``read``, by default the job it
    resets), the rotation starts and waits for that transaction's lock, then the app resets
    the job and commits."""
    reset: list[int] = []
    with Session(engine) as app:
        job = app.get(Job, job_id if read is None else read)
        assert job is not None
        rotation = Rotation(engine)
        rotation.start()
        _wait_for(engine, lambda c: c.execute(ROTATION_WAITS).scalar() > 0)
        reset += JobQueue(app).reset(job_id)
        app.commit()
    rotation.join(60)
    assert not rotation.is_alive()
    return rotation, reset


@pytest.mark.parametrize("app_read", ["another job", "the job"])
def test_a_job_reset_while_the_rotation_waits_for_its_range_is_not_dropped(
        fresh: Engine, app_read: str) -> None:  # noqa: F811
    """Issue 37, item 1: the rotation decided to drop the range before its lock was granted;
    the reset committed meanwhile and the job's record went with the range (the app had read
    another job), or the two deadlocked (the app had read the job itself)."""
    job_id, other = _one_settled_job_in_a_closed_range(fresh, keep=timedelta(hours=1))
    rotation, reset = _reset_while_the_rotation_waits(
        fresh, job_id, read=other if app_read == "another job" else None)
    assert rotation.error is None, rotation.error
    assert reset == [job_id]
    assert rotation.report is not None
    assert rotation.report.waited == []
    assert "postjobs_from_1000000" not in rotation.report.dropped
    assert ("postjobs_from_1000000", job_id, None) in rotation.report.pinned
    with Session(fresh) as s:
        assert s.execute(ORPHANS).scalar() == 0
        job = s.get(Job, job_id)
        assert job is not None and job.status == "ready"
        assert JobQueue(s, registry=reg, fast_mode=True).drain() == 2
        s.expire_all()
        assert s.get(Job, job_id).status == "ok"  # type: ignore[union-attr]


@pytest.mark.parametrize("app_read", ["another job", "the job"])
def test_compaction_and_an_app_that_read_the_record_then_resets_do_not_deadlock(
        fresh: Engine, app_read: str) -> None:  # noqa: F811
    """Issue 37, item 2: the compaction held its range and asked for the record; the app held
    the record (it had read a job) and asked for the range: a deadlock, raised raw."""
    job_id, other = _one_settled_job_in_a_closed_range(fresh, keep=None)
    rotation, reset = _reset_while_the_rotation_waits(
        fresh, job_id, read=other if app_read == "another job" else None)
    assert rotation.error is None, rotation.error
    assert reset == [job_id]
    assert rotation.report is not None
    assert rotation.report.waited == []  # no deadlock, handled or not: it waited its turn
    assert rotation.report.compacted == []  # it holds an unfinished job now
    with Session(fresh) as s:
        assert s.execute(ORPHANS).scalar() == 0
        assert JobQueue(s, registry=reg, fast_mode=True).drain() == 2
    report = _rotate(fresh)
    assert report.compacted == ["postjobs_from_1000000"]  # settled again


def test_an_app_that_read_a_job_then_enqueues_while_a_range_is_created_does_not_deadlock(
        fresh: Engine) -> None:  # noqa: F811
    """Round 5: the creation of a range held the record (SHARE ROW EXCLUSIVE: reads go on)
    and waited for the default partition, which an app's transaction held (it had read a
    job); that transaction's enqueue then waited for the record: a deadlock, and PostgreSQL
    chose the enqueue (the app got DeadlockDetected) or the rotation (``busy``)."""
    with Session(fresh) as s:
        JobQueue(s, registry=reg).enqueue(work, 1)
        s.commit()
    with fresh.connect() as conn:
        deadlock_timeout = conn.execute(text(
            "SELECT setting::float / 1000 FROM pg_settings WHERE name = 'deadlock_timeout'"
        )).scalar_one()
    with Session(fresh) as app:
        # the app's transaction lists its jobs: the record read, every range of it locked
        assert app.scalars(select(Job).where(Job.workflow == "hist.work")).all() != []
        rotation = Rotation(fresh)
        rotation.start()  # a fresh record: it creates [1,000,000, 2,000,000)
        _wait_for(fresh, lambda c: c.execute(ROTATION_WAITS_OR_TRIES).scalar() > 0)
        time.sleep(deadlock_timeout + 0.5)  # its check for a deadlock is past: ours comes
        new_id = JobQueue(app, registry=reg).enqueue(work, 2).id
        app.commit()
    rotation.join(60)
    assert not rotation.is_alive()
    assert rotation.error is None, rotation.error
    assert rotation.report is not None
    assert rotation.report.waited == [], rotation.report.waited
    assert rotation.report.created == ["postjobs_from_1000000"]
    with Session(fresh) as s:
        assert s.get(Job, new_id) is not None
        assert JobQueue(s, registry=reg, fast_mode=True).drain() == 2


def test_a_range_a_long_reader_keeps_from_being_created_is_busy_after_5_s(
        fresh: Engine) -> None:  # noqa: F811
    """The creation tries again while a reader holds the default partition, 5 s at most: then
    ``busy`` in the report (not a wait that never ends), and the next rotation creates it."""
    with fresh.connect() as reader:
        assert reader.execute(select(Job.id)).all() == []  # holds every range till it ends
        started = time.monotonic()
        report = _rotate(fresh)
        took = time.monotonic() - started
        reader.rollback()
    assert report.busy and report.created == [], report
    assert [name for name, _ in report.waited] == ["postjobs_from_1000000"], report.waited
    assert 5.0 <= took < 10.0, took
    assert _rotate(fresh).created == ["postjobs_from_1000000"]


class Traffic:
    """Producers that enqueue (each its own connection) and runners that run jobs, until
    stopped; the ids enqueued and the errors met."""

    def __init__(self, engine: Engine, producers: int = 3, runners: int = 1) -> None:
        self.engine = engine
        self.stop = threading.Event()
        self.ids: list[int] = []
        self.errors: list[BaseException] = []
        self.threads = ([threading.Thread(target=self._produce, daemon=True)
                         for _ in range(producers)]
                        + [threading.Thread(target=self._run, daemon=True)
                           for _ in range(runners)])

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads)

    def _produce(self) -> None:
        with Session(self.engine) as s:
            q = JobQueue(s, registry=reg)
            while not self.stop.is_set():
                try:
                    ids = [q.enqueue(work, n).id for n in range(5)]
                    s.commit()
                    self.ids += ids
                except Exception as exc:  # counted; the stream goes on
                    s.rollback()
                    self.errors.append(exc)

    def _run(self) -> None:
        with Session(self.engine) as s:
            q = JobQueue(s, registry=reg, fast_mode=True)
            while not self.stop.is_set():
                try:
                    if q.step() is None:
                        time.sleep(0.02)
                except Exception as exc:
                    s.rollback()
                    self.errors.append(exc)


LAST_ID = text("SELECT last_value FROM postjob.postjobs_id_seq")
IN_DEFAULT = text("SELECT count(*) FROM postjob.postjobs_default")


@pytest.mark.parametrize("keep", [timedelta(hours=1), None])
def test_a_rotation_behind_by_ranges_catches_up_under_a_steady_stream_of_enqueues(
        fresh: Engine, keep: timedelta | None) -> None:  # noqa: F811
    """Issue 37, item 3: the jobs of a missing range wait in the default partition; the
    rotation moved them under its snapshot and then attached the range, and an enqueue that
    committed meanwhile failed the attach (a raw CheckViolation, undoing the drop of the
    rotation too). Now: no rotation fails, the default partition ends empty, every job
    enqueued is there once, and the drop of a range past keep is done whatever else waits.
    Without a keep (and the first range compacted already) the rotation that catches up has
    nothing else to do: it creates the ranges without holding the whole record."""
    with Session(fresh) as s:
        JobQueue(s).set_history(keep=keep, partition_size=1000)
        s.commit()
    if keep is None:
        with fresh.begin() as conn:
            conn.execute(text("ALTER TABLE postjob.postjobs_from_0 SET (fillfactor = 100)"))
    _at(fresh, 1_000_000)  # past the first range, and no range made for what comes
    reports: list[RotationReport] = []
    errors: list[BaseException] = []
    with Traffic(fresh) as traffic:
        _wait_for(fresh, lambda c: c.execute(LAST_ID).scalar() > 1_002_500, 120)
        end = time.monotonic() + 8
        while time.monotonic() < end:
            try:
                reports.append(_rotate(fresh))
            except Exception as exc:  # what main raised
                errors.append(exc)
            time.sleep(0.1)

    def kinds(errs: list[BaseException]) -> list[str]:
        return sorted({type(getattr(e, "orig", e)).__name__ for e in errs})

    assert not (errors or traffic.errors), (
        f"{len(errors)} of {len(errors) + len(reports)} rotations failed: {kinds(errors)}; "
        f"the traffic met {kinds(traffic.errors)}")
    assert [r.failed for r in reports if r.failed] == []
    final = _rotate(fresh)  # the traffic stopped: nothing holds the record now
    assert final.busy is False and final.failed == []
    reports.append(final)
    assert [r.dropped for r in reports if r.dropped] == ([["postjobs_from_0"]] if keep else [])
    with fresh.connect() as conn:
        assert conn.execute(IN_DEFAULT).scalar() == 0
        count, distinct = conn.execute(text(
            "SELECT count(*), count(DISTINCT id) FROM postjob.postjobs")).one()
    assert len(traffic.ids) == len(set(traffic.ids)) == count == distinct
    print(f"{len(traffic.ids)} jobs enqueued, {len(reports)} rotations, "
          f"{sum(len(r.created) for r in reports)} ranges created, "
          f"{sum(r.jobs_moved for r in reports)} jobs moved from the default partition")
    with Session(fresh) as s:
        present = {i for (i,) in s.execute(text("SELECT id FROM postjob.postjobs"))}
    assert present == set(traffic.ids)


def _upkeep_lines(engine: Engine) -> list[str]:
    """What the workers' upkeep logs of history, the first time it looks."""
    conn = Conn.open(engine)
    try:
        return [line for line in Upkeep(engine, WorkerOptions()).look(conn) if "history" in line]
    finally:
        conn.close()


def _behind_with_ranges_past_keep(engine: Engine) -> None:
    """Two closed ranges past keep, no range for the next ids, one job in the default."""
    with Session(engine) as s:
        JobQueue(s).set_history(keep=timedelta(hours=1), partition_size=1000)
        s.commit()
    _at(engine, 1_000_000)
    _rotate(engine)  # [1,000,000, 1,001,000) and the one after; the first range dropped
    _at(engine, 1_002_500)
    with Session(engine) as s:
        JobQueue(s, registry=reg).enqueue(work, 1)
        s.commit()


def test_a_lock_the_rotation_cannot_have_is_busy_in_its_report_never_an_error(
        fresh: Engine) -> None:  # noqa: F811
    """Issue 37, item 2: a reader of the default partition keeps every step from its lock
    (each detach and attach changes what the default may hold) for more than 5 s: the
    rotation says ``busy`` (the upkeep logs it so, not as a failure) and the next one does it
    all; on main the whole rotation raised (lock timeout of the attach)."""
    _behind_with_ranges_past_keep(fresh)
    with fresh.connect() as reader:
        assert reader.execute(IN_DEFAULT).scalar() == 1  # holds the default until it ends
        lines = _upkeep_lines(fresh)
        reader.rollback()
    assert lines == ["history: created 0 range(s); dropped 0 range(s), 0 job(s); busy "
                     "(postjobs_default), tried again at the next rotation: canceling "
                     "statement due to lock timeout"], lines
    report = _rotate(fresh)
    assert report.created == ["postjobs_from_1002000", "postjobs_from_1003000"]
    assert report.dropped == ["postjobs_from_1000000", "postjobs_from_1001000"]
    assert report.jobs_moved == 1 and not report.busy


def test_a_step_that_fails_undoes_nothing_else(fresh: Engine) -> None:  # noqa: F811
    """Issue 37, item 3: each step is a subtransaction of its own. A table left where the
    next range goes makes its creation fail: the report and the upkeep's log say so, and the
    drops of the same rotation stand (on main the error undid the whole rotation)."""
    _behind_with_ranges_past_keep(fresh)
    with fresh.begin() as conn:
        conn.execute(text("CREATE TABLE postjob.postjobs_from_1002000 (id bigint)"))
    lines = _upkeep_lines(fresh)
    assert len(lines) == 1 and lines[0].startswith(
        "history: created 0 range(s); dropped 2 range(s), 0 job(s): postjobs_from_1000000, "
        "postjobs_from_1001000; failed postjobs_from_1002000: relation "), lines
    with fresh.begin() as conn:
        conn.execute(text("DROP TABLE postjob.postjobs_from_1002000"))
    report = _rotate(fresh)
    assert report.created == ["postjobs_from_1002000", "postjobs_from_1003000"]
    assert report.jobs_moved == 1 and report.failed == []
