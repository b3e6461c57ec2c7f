"""Enqueue joins the caller's transaction; bad input fails before anything is written."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, Job, JobNotFound, JobQueue, Status

pytestmark = pytest.mark.both_drivers


@postjob_sa.workflow(name="enq.add", max_attempts=3, timeout=100, queue="math")
def add(a: int, b: int) -> int:
    return a + b


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.jobs")).scalar_one())


def test_enqueue_returns_the_flushed_job_with_defaults(session: Session, queue: JobQueue) -> None:
    job = queue.enqueue(add, 1, 2, tags={"team": "a"})
    assert isinstance(job, Job)
    assert job.id > 0 and job.root_id == job.id and job.full_id == str(job.id)
    assert job.status is Status.ready
    assert job.args == [1, 2]
    assert job.queue == "math" and job.max_attempts == 3 and job.timeout == 100
    assert job.timing_out_at is not None and job.next_run_at is not None
    assert (job.timing_out_at - job.created_at).total_seconds() == pytest.approx(100, abs=0.5)
    assert job.tags == {"team": "a"}
    assert job.workflow == "enq.add" and job.workflow_version == ""


def test_enqueue_by_name_uses_table_defaults(queue: JobQueue) -> None:
    job = queue.enqueue("somewhere.else", {"k": [1, None]})
    assert job.queue == "q" and job.max_attempts == 5 and job.timing_out_at is None
    assert job.args == [{"k": [1, None]}]


def test_plain_session_add_gives_the_same_row(session: Session, queue: JobQueue) -> None:
    via_api = queue.enqueue("same", 1, 2)
    plain = Job(workflow="same", args=[1, 2])
    session.add(plain)
    session.flush()
    session.refresh(plain)
    session.refresh(via_api)
    # (_queued: whether the inserting statement queued the job itself, as enqueue does)
    skip = {"id", "root_id", "full_id", "created_at", "updated_at", "next_run_at", "_queued"}
    for attr in Job.__mapper__.column_attrs.keys():
        if attr not in skip:
            assert getattr(plain, attr) == getattr(via_api, attr), attr
    assert plain.root_id == plain.id and plain.full_id == str(plain.id)


def test_child_ids_are_derived_for_any_insert(session: Session, queue: JobQueue) -> None:
    root = queue.enqueue("tree", 1)
    child = Job(workflow="tree", args=[2], parent_id=root.id)
    session.add(child)
    session.flush()
    grandchild = queue.enqueue("tree", 3, parent_id=child.id)
    session.refresh(child)
    assert child.root_id == root.id and child.full_id == f"{root.id}.{child.id}"
    assert grandchild.root_id == root.id
    assert grandchild.full_id == f"{root.id}.{child.id}.{grandchild.id}"


def test_rollback_un_enqueues(engine: Engine, session: Session, queue: JobQueue) -> None:
    queue.enqueue(add, 1, 2)
    queue.enqueue_many(add, [[i, i] for i in range(5)])
    session.rollback()
    assert _count(engine) == 0
    queue.enqueue(add, 1, 2)
    session.commit()
    assert _count(engine) == 1


def test_enqueue_does_not_commit(engine: Engine, session: Session, queue: JobQueue) -> None:
    queue.enqueue(add, 1, 2)
    assert _count(engine) == 0  # another connection sees nothing yet
    session.commit()
    assert _count(engine) == 1


def test_enqueue_many_in_one_statement(session: Session, queue: JobQueue) -> None:
    ids = queue.enqueue_many(add, [[i, 1] for i in range(100)], tags={"batch": 1})
    assert len(ids) == 100 and ids == sorted(ids)
    jobs = session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id)).all()
    assert [j.args for j in jobs] == [[i, 1] for i in range(100)]
    assert all(j.root_id == j.id and j.full_id == str(j.id) for j in jobs)
    assert all(j.queue == "math" and j.max_attempts == 3 for j in jobs)
    assert all(j.timing_out_at is not None for j in jobs)
    assert queue.enqueue_many(add, []) == []


def test_run_at_schedules_the_job(session: Session, queue: JobQueue) -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    job = queue.enqueue(add, 1, 1, run_at=when)
    assert abs((job.next_run_at - when).total_seconds()) < 0.001  # type: ignore[operator]
    session.commit()
    assert queue.drain() == 0


class NotJSON:
    pass


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((NotJSON(),), {}, "JSON"),
        ((math.nan,), {}, "JSON"),
        (("x" * (1 << 20),), {}, "limit"),
        ((1,), {"max_attempts": 0}, "max_attempts"),
        ((1,), {"max_attempts": 10**6}, "max_attempts"),
        ((1,), {"max_attempts": "3"}, "max_attempts"),
        ((1,), {"timeout": -1}, "timeout"),
        ((1,), {"timeout": math.inf}, "timeout"),
        ((1,), {"timeout": 10**12}, "timeout"),
        ((1,), {"queue": ""}, "queue"),
        ((1,), {"tags": ["a"]}, "tags"),
        ((1,), {"tags": {"a": {"nested": 1}}}, "tag"),
        ((1,), {"run_at": datetime(2030, 1, 1)}, "timezone"),
        ((1,), {"version": ""}, "version"),
        (("nul\x00",), {}, "NUL"),
    ],
)
def test_bad_input_fails_before_writing_and_the_session_stays_usable(
    engine: Engine, session: Session, queue: JobQueue, args: tuple[object, ...],
    kwargs: dict[str, object], message: str,
) -> None:
    queue.enqueue(add, 0, 0)  # the caller's own pending work
    with pytest.raises(InvalidArgument, match=message):
        queue.enqueue(add, *args, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        queue.enqueue_many(add, [list(args)], **kwargs)  # type: ignore[arg-type]
    queue.enqueue(add, 1, 1)
    session.commit()
    assert _count(engine) == 2


def test_unknown_parent_is_a_clear_error(session: Session, queue: JobQueue) -> None:
    with pytest.raises(JobNotFound, match="12345"):
        queue.enqueue(add, 1, 2, parent_id=12345)
    assert queue.enqueue(add, 1, 2).id > 0


def test_bad_workflow_names(queue: JobQueue) -> None:
    for bad in ("", "   ", None, 3, "x" * 300, "a\nb"):
        with pytest.raises(InvalidArgument):
            queue.enqueue(bad, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        queue.enqueue_many("w", ["not a list"])  # type: ignore[list-item]


def test_manual_workflow_name_is_reserved() -> None:
    with pytest.raises(InvalidArgument):
        postjob_sa.workflow(name="__manual__")(lambda: None)


@postjob_sa.workflow(name="enq.welcome")
def send_welcome_email(email: str) -> str:
    return email


@postjob_sa.workflow(name="enq.tx", transactional=True)
def record_order(session: Session, order_id: int, note: str = "") -> int:
    return order_id


@postjob_sa.workflow(name="enq.any")
def anything(first: int, *rest: int) -> int:
    return first


@pytest.mark.parametrize("target", [send_welcome_email, "enq.welcome"],
                         ids=["workflow", "registered name"])
def test_args_that_do_not_fit_the_workflow_are_refused_before_anything_is_written(
    engine: Engine, session: Session, queue: JobQueue, target: object
) -> None:
    """enqueue(send_welcome_email, "a", "b") for def send_welcome_email(email): each run
    would fail with a TypeError, retried every allowed attempt."""
    queue.enqueue(add, 0, 0)  # the caller's own pending work
    with pytest.raises(InvalidArgument, match=r'^the args \["a", "b"\] do not fit workflow '
                       r"'enq.welcome' \(email\): too many positional arguments$"):
        queue.enqueue(target, "a", "b")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="missing a required argument: 'email'"):
        queue.enqueue(target)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"^args list 2: .* too many positional"):
        queue.enqueue_many(target, [["a"], ["a", "b"]])  # type: ignore[arg-type]
    queue.enqueue(target, "u@example.com")  # type: ignore[arg-type]
    session.commit()
    assert _count(engine) == 2


def test_a_transactional_workflows_session_is_no_arg_of_the_job(queue: JobQueue) -> None:
    assert queue.enqueue(record_order, 7).args == [7]
    assert queue.enqueue(record_order, 7, "gift").args == [7, "gift"]
    with pytest.raises(InvalidArgument, match=r"\(order_id, note=''\): missing"):
        queue.enqueue(record_order)
    with pytest.raises(InvalidArgument, match="too many positional arguments"):
        queue.enqueue("enq.tx", 7, "gift", "wrap")


def test_args_are_checked_only_against_a_function_this_process_knows(queue: JobQueue) -> None:
    assert queue.enqueue(anything, 1, 2, 3).args == [1, 2, 3]  # *rest takes the others
    # another version of the workflow than the registered one: its function is not here
    assert queue.enqueue("enq.welcome", "a", "b", version="2").args == ["a", "b"]
    assert queue.enqueue("enq.not_here", "a", "b").args == ["a", "b"]  # no function at all
