"""WorkerOptions: the one validated configuration of a worker, which JobQueue's and
AsyncJobQueue's keywords and `postjob run` all build."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from postjob_sa import AsyncJobQueue, InvalidArgument, JobQueue, WorkerOptions


@pytest.mark.parametrize(("field", "value", "says"), [
    ("lease", 0, "lease"), ("lease", float("nan"), "lease"), ("batch", 0, "batch_size"),
    ("batch", 10_001, "batch_size"), ("batch", True, "batch_size"),
    ("concurrency", 1001, "concurrency"), ("poll_interval", -1, "poll_interval"),
    ("count", 0, "count"), ("wakeup_url", "not a url", "wakeup_url"), ("identifier", "", "identifier"),
])
def test_a_bad_value_is_refused_when_the_options_are_made(field: str, value: Any, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        WorkerOptions(**{field: value})


def test_the_queue_keywords_are_the_options(engine: Engine) -> None:
    with Session(engine) as s:
        by_keywords = JobQueue(s, True, lease=30, batch_size=50, concurrency=4,
                               identifier="w1", pooled=False, poll_interval=2,
                               wakeup_url="postgresql://127.0.0.1/x")
        assert by_keywords.options == WorkerOptions(
            fast_mode=True, lease=30.0, batch=50, concurrency=4, identifier="w1", pooled=False,
            poll_interval=2.0, wakeup_url=make_url("postgresql://127.0.0.1/x"))
        # the public attributes read them
        assert (by_keywords.lease, by_keywords.batch_size, by_keywords.fast_mode,
                by_keywords.concurrency, by_keywords.identifier) == (30.0, 50, True, 4, "w1")
        given = WorkerOptions(batch=7)
        assert JobQueue(s, options=given).batch_size == 7
        with pytest.raises(InvalidArgument, match="not both"):
            JobQueue(s, options=given, lease=5)
        with pytest.raises(InvalidArgument, match="batch_size"):
            JobQueue(s, batch_size=0)
        with pytest.raises(TypeError, match="batchsize"):
            JobQueue(s, batchsize=3)  # type: ignore[call-arg]


def test_a_worker_is_built_from_the_options_with_its_own_changes(engine: Engine) -> None:
    with Session(engine) as s:
        queue = JobQueue(s, lease=12, identifier="w2", pooled=False)
        worker = queue._worker(count=3, until_idle=True)
        assert (worker.opts.lease, worker.opts.identifier, worker.opts.count,
                worker.opts.until_idle) == (12.0, "w2", 3, True)
        with pytest.raises(InvalidArgument, match="count"):
            queue._worker(count=-1)


def test_the_async_queue_takes_the_same_options(db_url: Any) -> None:
    engine = create_async_engine(db_url.set(drivername="postgresql+psycopg"))
    session = AsyncSession(engine)
    try:
        queue = AsyncJobQueue(session, lease=9, batch_size=3)
        assert queue.options == WorkerOptions(lease=9.0, batch=3, identifier=queue.options.identifier)
        assert AsyncJobQueue(session, options=queue.options).options is queue.options
        with pytest.raises(InvalidArgument, match="concurrency"):
            AsyncJobQueue(session, concurrency=0)
    finally:
        session.sync_session.close()
