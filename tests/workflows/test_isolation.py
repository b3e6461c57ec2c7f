"""Wake-ups do not depend on the caller's isolation level.

The Session API runs at the caller's level. A caller at REPEATABLE READ or SERIALIZABLE works
from a snapshot taken when its transaction began; if a parent went to sleep after that, the
parent must still be woken when the caller resolves the child it waits for: either at once, or
through a serialization failure that the caller retries (as for any conflict at those levels).
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry

pytestmark = pytest.mark.both_drivers

reg = Registry()


@postjob_sa.workflow(name="iso.parent", registry=reg)
def parent() -> str:
    decision = postjob_sa.manual("approve")
    return str(decision.result())


#: The parent's run ends asleep, awaiting the child (as a worker's cycle records it); the ids
#: the database called lost.
SLEEP_AWAITING = text(
    "SELECT ARRAY(SELECT f.id FROM postjob.finish_v4('{}', '{}', '{}', '{}', "
    "ARRAY[CAST(:id AS bigint)], ARRAY[CAST(:lease AS bigint)], ARRAY['sleep'], ARRAY[NULL], "
    "ARRAY[NULL], ARRAY[NULL]::jsonb[], ARRAY[''], ARRAY[CAST(:child AS bigint)], "
    "ARRAY[NULL]::float8[], '{}', '{}') f WHERE f.kind = 'lost')"
)


def _status(engine: Engine, job_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                                {"i": job_id}).scalar_one())


@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def test_resolving_wakes_a_parent_that_went_to_sleep_after_the_callers_snapshot(
    engine: Engine, clean: None, level: str
) -> None:
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True, registry=reg)
        parent_id = q.enqueue(parent).id
        s.commit()
        assert q.drain() == 1  # first run: creates the manual child and sleeps
        child_id, token = s.execute(text(
            "SELECT j.id, postjob.manual_token(j.id)::text FROM postjob.jobs j "
            "WHERE j.parent_id = :p"), {"p": parent_id}).one()
        s.commit()
        q.force(parent_id)  # the parent runs again ...
        s.commit()
        (running,) = q.checkout(workflows=["iso.parent"])
        lease = running.lease_token
        s.commit()  # ... and is processing

    with engine.connect().execution_options(isolation_level=level) as resolver:
        resolver.begin()
        resolver.execute(text("SELECT 1"))  # the caller's snapshot: the parent is processing
        with engine.begin() as conn:  # the parent's run ends: asleep, awaiting the child
            lost = conn.execute(SLEEP_AWAITING, {
                "id": parent_id, "lease": lease, "child": child_id}).scalar_one()
            assert lost == []
        assert _status(engine, parent_id) == "sleep"
        try:
            JobQueue(Session(bind=resolver)).resolve(token, "yes")
            resolver.commit()
        except OperationalError as exc:  # a serialization failure: the caller retries
            assert "could not serialize" in str(exc)
            resolver.rollback()
            resolver.begin()
            JobQueue(Session(bind=resolver)).resolve(token, "yes")
            resolver.commit()

    assert _status(engine, parent_id) == "ready"
    with Session(engine) as s:
        assert JobQueue(s, fast_mode=True, registry=reg).drain() == 1
    assert _status(engine, parent_id) == "ok"
