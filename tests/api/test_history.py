"""History (design.md §11): the record partitioned by ranges of job id, the settings, the
rotation that creates ranges ahead and drops those past keep, never one that holds a job of
an unfinished tree; jobs whose range is missing wait in the default partition; ORM reads and
host foreign keys across ranges."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Engine, MetaData, Table, select, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, Job, JobQueue, Registry, RotationReport
from postjob_sa._db import Conn
from postjob_sa.worker.options import WorkerOptions
from postjob_sa.worker.upkeep import Upkeep

pytestmark = pytest.mark.both_drivers

reg = Registry()


@postjob_sa.workflow(name="hist.work", registry=reg)
def work(x: int) -> int:
    return x


@postjob_sa.workflow(name="hist.tree", registry=reg)
def tree() -> list[Any]:
    first = work.spawn(1).result()
    return [first, postjob_sa.manual("approve").result()]


RANGES = text(
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = 'postjob.postjobs'::regclass ORDER BY 1")
WHERE = text("SELECT tableoid::regclass::text FROM postjob.postjobs WHERE id = :id")
NEXT_ID_AT = text("SELECT setval('postjob.postjobs_id_seq', :id - 1)")


@pytest.fixture
def fresh(engine: Engine, clean: None) -> Iterator[Engine]:
    """The record as the revision leaves it: the first range and the default partition."""
    def reset() -> None:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS hist_host"))
            for (name,) in conn.execute(RANGES).all():
                if name not in ("postjobs_from_0", "postjobs_default"):
                    conn.execute(text(f'DROP TABLE postjob."{name}"'))
            conn.execute(text("CREATE TABLE IF NOT EXISTS postjob.postjobs_from_0 PARTITION OF "
                              "postjob.postjobs FOR VALUES FROM (MINVALUE) TO (1000000) "
                              "WITH (fillfactor = 50)"))
            conn.execute(text("DELETE FROM postjob.history_settings"))
            conn.execute(text("DELETE FROM postjob.history_partitions"))
    reset()
    yield engine
    reset()


def _rotate(engine: Engine) -> RotationReport:
    with Session(engine) as s:
        report = JobQueue(s).rotate_history()
        s.commit()
    return report


def _at(engine: Engine, next_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(NEXT_ID_AT, {"id": next_id})


def _where(engine: Engine, job_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(WHERE, {"id": job_id}).scalar_one())


def test_set_history_is_checked_before_anything_is_written(fresh: Engine) -> None:
    with Session(fresh) as s:
        q = JobQueue(s)
        for bad in ({"partition_size": 999}, {"partition_size": True},
                    {"partition_size": "1000"}, {"keep": timedelta(0)},
                    {"keep": timedelta(seconds=-1)}, {"keep": 3600}):
            with pytest.raises(InvalidArgument):
                q.set_history(**bad)  # type: ignore[arg-type]
        assert s.execute(text("SELECT count(*) FROM postjob.history_settings")).scalar() == 0
        assert q.history_settings() == postjob_sa.HistorySettings(None, 1_000_000)
        q.set_history(keep=timedelta(days=7), partition_size=5000)  # the transaction is usable
        assert q.history_settings() == postjob_sa.HistorySettings(timedelta(days=7), 5000)
        s.rollback()  # written in the caller's transaction: gone with it
        assert q.history_settings() == postjob_sa.HistorySettings(None, 1_000_000)


def test_the_rotation_runs_at_read_committed(fresh: Engine) -> None:
    """It decides on what it sees once its locks are granted: a snapshot older than the
    locks (REPEATABLE READ, SERIALIZABLE) would miss a job reset while it waited."""
    with Session(fresh.execution_options(isolation_level="REPEATABLE READ")) as s:
        with pytest.raises(InvalidArgument, match="READ COMMITTED"):
            JobQueue(s).rotate_history()
        assert JobQueue(s).history_settings().partition_size == 1_000_000  # still usable
    with fresh.connect() as conn, pytest.raises(Exception, match="READ COMMITTED"):
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"))
        conn.execute(text("SELECT * FROM postjob.rotate_history()"))


def test_a_job_whose_range_is_missing_waits_in_the_default_and_the_rotation_moves_it(
        fresh: Engine) -> None:
    _at(fresh, 1_000_500)  # past the first range, and no rotation made the next one
    with Session(fresh) as s:
        q = JobQueue(s, registry=reg, fast_mode=True)
        job_id = q.enqueue(work, 7).id  # never an error
        s.commit()
        assert _where(fresh, job_id) == "postjob.postjobs_default"
        assert s.get(Job, job_id) is not None
    report = _rotate(fresh)  # its range, and the one after it (ahead)
    assert report.created == ["postjobs_from_1000000", "postjobs_from_2000000"]
    assert report.jobs_moved == 1
    assert _where(fresh, job_id) == "postjob.postjobs_from_1000000"
    with Session(fresh) as s:
        assert JobQueue(s, registry=reg, fast_mode=True).drain() == 1
        job = s.get(Job, job_id)
        assert job is not None and job.results == [7]
    assert _rotate(fresh).created == []  # ahead already


def test_ranges_are_made_ahead_of_the_ids_to_come(fresh: Engine) -> None:
    with Session(fresh) as s:
        JobQueue(s).set_history(partition_size=1000)
        s.commit()
    _at(fresh, 999_990)
    assert _rotate(fresh).created == ["postjobs_from_1000000"]
    _at(fresh, 1_000_100)
    assert _rotate(fresh).created == ["postjobs_from_1001000"]


def _step(engine: Engine) -> int | None:
    with Session(engine) as s:
        return JobQueue(s, registry=reg, fast_mode=True).step()


def test_a_range_holding_a_job_of_an_unfinished_tree_is_kept(fresh: Engine) -> None:
    """A parent asleep on a manual step; its first child, in a range of its own, finished long
    ago: that range stays while ranges of finished trees go, and the parent still ends with
    the child's result."""
    with Session(fresh) as s:
        JobQueue(s).set_history(partition_size=1000)
        s.commit()
    _at(fresh, 1_000_000)
    _rotate(fresh)  # [1,000,000, 1,001,000)
    with Session(fresh) as s:
        q = JobQueue(s, registry=reg, fast_mode=True)
        done = q.enqueue(work, 0).id  # a tree of its own, finished
        s.commit()
        q.drain()
    _at(fresh, 1_001_000)
    _rotate(fresh)
    with Session(fresh) as s:
        parent = JobQueue(s, registry=reg).enqueue(tree).id
        s.commit()
    _at(fresh, 1_002_000)
    _rotate(fresh)
    assert _step(fresh) == parent  # spawns its first child, in the next range, and sleeps
    child = parent_child = _step(fresh)
    assert child is not None and _where(fresh, child) == "postjob.postjobs_from_1002000"
    _at(fresh, 1_003_000)
    _rotate(fresh)
    assert _step(fresh) == parent  # the child's result; a manual step, in the next range
    with fresh.begin() as conn:
        conn.execute(text("UPDATE postjob.postjobs SET updated_at = now() - interval '2 days'"))
    with Session(fresh) as s:
        JobQueue(s).set_history(keep=timedelta(days=1), partition_size=1000)
        s.commit()

    report = _rotate(fresh)
    assert sorted(report.dropped) == ["postjobs_from_0", "postjobs_from_1000000"]
    assert report.jobs_dropped == 1
    assert sorted(report.pinned) == [("postjobs_from_1001000", parent, None),
                                     ("postjobs_from_1002000", parent, None)]
    with Session(fresh) as s:
        status = {r.name: r for r in JobQueue(s).history_status()}
        assert status["postjobs_from_1002000"].pinned_by == parent
        assert status["postjobs_from_1002000"].jobs == 1
        assert s.get(Job, done) is None
        q = JobQueue(s, registry=reg, fast_mode=True)
        token = s.execute(text("SELECT postjob.manual_token(id)::text FROM postjob.postjobs "
                               "WHERE parent_id = :p AND workflow = '__manual__'"),
                          {"p": parent}).scalar_one()
        q.resolve(token, "yes")
        s.commit()
        q.drain()
        finished = s.get(Job, parent)
        assert finished is not None and finished.results == [[1, "yes"]]
        assert s.get(Job, parent_child) is not None
    # once the tree is finished (and old), its ranges go too
    with fresh.begin() as conn:
        conn.execute(text("UPDATE postjob.postjobs SET updated_at = now() - interval '2 days'"))
    assert "postjobs_from_1002000" in _rotate(fresh).dropped


def test_two_rotations_at_once_drop_nothing_twice_and_fail_nothing(fresh: Engine) -> None:
    with Session(fresh) as s:
        JobQueue(s).set_history(keep=timedelta(hours=1), partition_size=1000)
        s.commit()
    _at(fresh, 1_000_000)
    _rotate(fresh)
    with Session(fresh) as s:
        JobQueue(s, registry=reg).enqueue(work, 1)
        s.commit()
    with Session(fresh) as s:
        JobQueue(s, registry=reg, fast_mode=True).drain()
    _at(fresh, 1_001_000)
    with fresh.begin() as conn:
        conn.execute(text("UPDATE postjob.postjobs SET updated_at = now() - interval '2 hours'"))

    reports: dict[str, RotationReport] = {}
    errors: list[BaseException] = []
    first_in, release = threading.Event(), threading.Event()

    def rotate(name: str) -> None:
        try:
            with Session(fresh) as s:
                reports[name] = JobQueue(s).rotate_history()
                if name == "first":  # its transaction stays open while the second rotates
                    first_in.set()
                    release.wait(10)
                s.commit()
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)
            first_in.set()

    first = threading.Thread(target=rotate, args=("first",))
    first.start()
    assert first_in.wait(10)
    second = threading.Thread(target=rotate, args=("second",))
    second.start()
    second.join(3)
    release.set()
    first.join(10)
    second.join(10)
    assert errors == []
    assert reports["first"].dropped == ["postjobs_from_1000000"]
    assert reports["second"].dropped == [] and reports["second"].busy
    assert _rotate(fresh).dropped == []  # and the next one finds nothing more


def test_orm_reads_and_host_foreign_keys_work_across_ranges(fresh: Engine) -> None:
    with fresh.begin() as conn:  # an app's table, made after the upgrade
        conn.execute(text("CREATE TABLE hist_host (id bigint PRIMARY KEY, "
                          "job_id bigint REFERENCES postjob.postjobs (id))"))
    host = Table("hist_host", MetaData(), Column("id", BigInteger, primary_key=True),
                 Column("job_id", BigInteger))
    with Session(fresh) as s:
        JobQueue(s).set_history(keep=timedelta(hours=1), partition_size=1000)
        s.commit()
    _at(fresh, 1_000_000)
    _rotate(fresh)
    ids = []
    for next_id in (1_000_000, 1_000_999, 1_001_000):  # two in the first range, one after
        _at(fresh, next_id)
        if next_id == 1_001_000:
            _rotate(fresh)
        with Session(fresh) as s:
            job = Job(workflow="hist.work", args=[len(ids)])
            s.add(job)
            s.commit()
            ids.append(job.id)
    with Session(fresh) as s:
        assert JobQueue(s, registry=reg, fast_mode=True).drain() == 3
    assert [_where(fresh, i) for i in ids] == [
        "postjob.postjobs_from_1000000", "postjob.postjobs_from_1000000",
        "postjob.postjobs_from_1001000"]
    with Session(fresh) as s:
        s.execute(host.insert(), [{"id": n, "job_id": i} for n, i in enumerate(ids)])
        s.commit()
        joined = s.execute(select(host.c.id, Job.args).join(Job, Job.id == host.c.job_id)
                           .order_by(host.c.id)).all()
        assert [tuple(r) for r in joined] == [(0, [0]), (1, [1]), (2, [2])]
        assert sorted(s.scalars(select(Job.id).where(Job.workflow == "hist.work"))) == ids
        for i in ids:
            assert s.get(Job, i) is not None
            s.expunge_all()
        # a lookup by id touches one range
        plan = "\n".join(r[0] for r in s.execute(text(
            "EXPLAIN SELECT * FROM postjob.postjobs WHERE id = :id"), {"id": ids[2]}))
        assert plan.count(" on postjobs_") == 1 and " on postjobs_from_1001000 " in plan
        # a host's row referring to a job pins its range (its foreign key holds)
        s.execute(text("UPDATE postjob.postjobs SET updated_at = now() - interval '2 hours'"))
        s.commit()
        with pytest.raises(Exception, match="foreign key"):
            with s.begin_nested():
                s.execute(text("DELETE FROM postjob.postjobs WHERE id = :i"), {"i": ids[0]})
    report = _rotate(fresh)
    assert [(name, root) for name, root, _ in report.pinned] == [("postjobs_from_1000000", None)]
    assert "foreign key" in str(report.pinned[0][2])


def test_enqueues_of_the_same_child_in_two_transactions_make_one_child(fresh: Engine) -> None:
    with Session(fresh) as s:
        parent = JobQueue(s, registry=reg).enqueue(tree).id
        s.commit()
    with Session(fresh) as first, Session(fresh) as second:
        a = JobQueue(first, registry=reg).enqueue(work, 5, parent_id=parent).id
        found: list[int] = []
        t = threading.Thread(target=lambda: found.append(
            JobQueue(second, registry=reg).enqueue(work, 5, parent_id=parent).id))
        t.start()
        t.join(1)  # waits for the first transaction (the parent's children lock)
        first.commit()
        t.join(10)
        second.commit()
    assert found == [a]


def test_the_upkeep_rotates_history(fresh: Engine) -> None:
    _at(fresh, 1_000_100)
    upkeep = Upkeep(fresh, WorkerOptions())
    conn = Conn.open(fresh)
    try:
        lines = upkeep.look(conn)
    finally:
        conn.close()
    assert any("postjobs_from_1000000" in line for line in lines), lines
    with fresh.connect() as c:
        assert "postjobs_from_1000000" in [r[0] for r in c.execute(RANGES)]


NOOPS = text(
    "INSERT INTO postjob.postjobs (workflow, args, queue, status, queued) "
    "SELECT 'hist.noop', '[]', 'q', 'ready', true FROM generate_series(1, :n)")
SIZE = text("SELECT pg_total_relation_size(CAST(:t AS regclass))")


def test_a_closed_range_of_settled_jobs_is_compacted_into_full_pages(fresh: Engine) -> None:
    """Open ranges keep half their pages free (a job's updates stay on its page); once a range
    is closed and its jobs settled, the rotation rewrites it into full pages: at most 260
    bytes on disk per finished no-op job (546 in pj0009's record)."""
    n = 20_000
    with Session(fresh) as s:
        JobQueue(s).set_history(partition_size=n)
        s.commit()
    _at(fresh, 1_000_000)
    _rotate(fresh)  # [1,000,000, 1,020,000) and the next
    with fresh.begin() as conn:
        conn.execute(NOOPS, {"n": n})  # as enqueued, then settled by their runs: updated once
        conn.execute(text("UPDATE postjob.postjobs SET status = 'ok', results = '[null]', "
                          "updated_at = now() WHERE workflow = 'hist.noop'"))
    vacuum = fresh.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        vacuum.execute(text("VACUUM (ANALYZE) postjob.postjobs"))
        before = vacuum.execute(SIZE, {"t": "postjob.postjobs_from_1000000"}).scalar_one()
        _at(fresh, 1_020_000)  # the range is closed
        report = _rotate(fresh)
        assert report.compacted == ["postjobs_from_1000000"]
        vacuum.execute(text("VACUUM (ANALYZE) postjob.postjobs"))
        after = vacuum.execute(SIZE, {"t": "postjob.postjobs_from_1000000"}).scalar_one()
        options = vacuum.execute(text(
            "SELECT reloptions FROM pg_class WHERE oid = 'postjob.postjobs_from_1000000'::regclass"
        )).scalar_one()
    finally:
        vacuum.close()
    assert "fillfactor=100" in options
    print(f"bytes per finished no-op job: {before / n:.0f} open, {after / n:.0f} compacted")
    assert after / n <= 260, (before / n, after / n)
    assert after < before * 0.7
    with Session(fresh) as s:
        assert s.scalar(select(Job.id).where(Job.id == 1_010_000)) == 1_010_000
        assert s.execute(text("SELECT count(*) FROM postjob.postjobs WHERE status = 'ok'")
                         ).scalar() == n
    assert _rotate(fresh).compacted == []  # once


def test_history_settings_have_upper_bounds(fresh: Engine) -> None:
    """Issue 37, item 6: a keep or a size too large for the rotation's arithmetic is refused
    before anything is written (it was accepted, or raised a raw DataError that aborted the
    caller's transaction), and a row written past them by older code does not fail it."""
    with Session(fresh) as s:
        q = JobQueue(s)
        for bad in ({"keep": timedelta(days=999_999_999)}, {"keep": timedelta(days=36_501)},
                    {"partition_size": 2**63 - 1}, {"partition_size": 2**63},
                    {"partition_size": 1_000_000_001}):
            with pytest.raises(InvalidArgument, match="at most"):
                q.set_history(**bad)  # type: ignore[arg-type]
        assert s.execute(text("SELECT count(*) FROM postjob.history_settings")).scalar() == 0
        q.set_history(keep=timedelta(days=36_500), partition_size=1_000_000_000)  # the bounds
        s.commit()
    _at(fresh, 1_000)
    assert _rotate(fresh).created == ["postjobs_from_1000000"]
    with fresh.begin() as conn:
        conn.execute(text("UPDATE postjob.history_settings SET keep = interval '999999999 days', "
                          "partition_size = 9223372036854775807"))
    _at(fresh, 999_999_999)
    report = _rotate(fresh)  # taken at the bounds: no error
    assert report.failed == [] and "postjobs_from_0" in report.dropped


def test_the_open_range_closes_within_partition_size_ids_of_the_setting(fresh: Engine) -> None:
    """Issue 37, item 7: on a fresh install the first range holds a million ids; once the
    size is set, the rotation narrows the open range to end partition_size ids on, so that
    retention and compaction follow the size set."""
    _at(fresh, 100)  # ids up to 99 handed out
    with Session(fresh) as s:
        JobQueue(s).set_history(keep=timedelta(minutes=1), partition_size=20_000)
        s.commit()
    _rotate(fresh)
    with Session(fresh) as s:
        ends = [(r.name, r.to_id) for r in JobQueue(s).history_status()]
    assert ends == [("postjobs_from_0", 20_100), ("postjobs_from_20100", 40_100),
                    ("postjobs_default", None)]
    with fresh.begin() as conn:
        conn.execute(NOOPS, {"n": 25_000})  # ids 100 to 25,099, settled two minutes ago
        conn.execute(text("UPDATE postjob.postjobs SET status = 'ok', results = '[null]', "
                          "updated_at = now() - interval '2 minutes'"))
    report = _rotate(fresh)
    assert report.dropped == ["postjobs_from_0"] and report.jobs_dropped == 20_000
    assert report.created == ["postjobs_from_40100"]
    assert _rotate(fresh).dropped == []  # the open range's jobs stay until it is closed
