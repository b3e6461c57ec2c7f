"""Values PostgreSQL refuses (a lone surrogate, a NUL, a document over the size limit) and
values JSON has no type for (Decimal, datetime, date, UUID): the API refuses each with
InvalidArgument before anything is written, the caller's session stays usable, and what
PostgreSQL does store (a backslash followed by ``u0000``) round-trips."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, Job, JobQueue, Registry

SURROGATE = os.fsdecode(b"file-\xff")  # "file-\udcff": not valid Unicode
BACKSLASH_U0000 = "C:\\u0000dir"  # a backslash, then the characters u0000: storable text
OVER_LIMIT = (128 << 20) + 1  # one byte over postjob_sa._json.MAX_DOCUMENT_BYTES

reg = Registry()


@postjob_sa.workflow(name="store.echo", registry=reg)
def echo(value: Any = None) -> Any:
    return value


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.jobs")).scalar_one())


Call = Callable[[JobQueue], Any]

ENQUEUE_CASES: list[tuple[str, Call, str]] = [
    ("arg with a lone surrogate", lambda q: q.enqueue(echo, SURROGATE), "lone surrogate"),
    ("nested arg with a lone surrogate", lambda q: q.enqueue(echo, {"path": [SURROGATE]}),
     "lone surrogate"),
    ("arg with a NUL", lambda q: q.enqueue(echo, "a\x00b"), "NUL"),
    ("dict key with a NUL", lambda q: q.enqueue(echo, {"a\x00": 1}), "NUL"),
    ("many: one arg with a lone surrogate",
     lambda q: q.enqueue_many(echo, [[1], [SURROGATE]]), "lone surrogate"),
    ("many: one arg with a NUL", lambda q: q.enqueue_many(echo, [["a\x00"], [2]]), "NUL"),
    ("tag value with a lone surrogate", lambda q: q.enqueue(echo, 1, tags={"file": SURROGATE}),
     "lone surrogate"),
    ("tag key with a lone surrogate", lambda q: q.enqueue(echo, 1, tags={SURROGATE: "x"}),
     "lone surrogate"),
    ("tag value with a NUL", lambda q: q.enqueue(echo, 1, tags={"k": "a\x00"}), "NUL"),
    ("many: tags with a lone surrogate",
     lambda q: q.enqueue_many(echo, [[1]], tags={"k": SURROGATE}), "lone surrogate"),
    ("workflow name with a lone surrogate", lambda q: q.enqueue(SURROGATE, 1),
     "workflow must be valid Unicode"),
    ("queue with a lone surrogate", lambda q: q.enqueue(echo, 1, queue=SURROGATE),
     "queue must be valid Unicode"),
    ("version with a lone surrogate", lambda q: q.enqueue(echo, 1, version=SURROGATE),
     "version must be valid Unicode"),
    ("many: queue with a lone surrogate",
     lambda q: q.enqueue_many(echo, [[1]], queue=SURROGATE), "queue must be valid Unicode"),
]


@pytest.mark.parametrize(("case", "call", "needle"), ENQUEUE_CASES, ids=[c[0] for c in ENQUEUE_CASES])
def test_enqueue_refuses_what_postgresql_cannot_store_and_the_session_stays_usable(
    engine: Engine, session: Session, case: str, call: Call, needle: str
) -> None:
    q = JobQueue(session, registry=reg)
    q.enqueue(echo, "before")  # the caller's own pending work
    with pytest.raises(InvalidArgument, match=needle):
        call(q)
    q.enqueue(echo, "after")
    session.commit()
    assert _count(engine) == 2


def test_a_workflow_named_with_a_lone_surrogate_is_refused_at_registration() -> None:
    with pytest.raises(InvalidArgument, match="workflow name must be valid Unicode"):
        postjob_sa.workflow(name=SURROGATE, registry=Registry())(lambda: None)
    with pytest.raises(InvalidArgument, match="queue must be valid Unicode"):
        postjob_sa.workflow(name="store.q", queue=SURROGATE, registry=Registry())(lambda: None)


def _checked_out(session: Session) -> tuple[JobQueue, Job]:
    q = JobQueue(session, registry=reg)
    q.enqueue(echo, 1)
    session.commit()
    [job] = q.checkout()
    return q, job


FINISH_CASES: list[tuple[str, Callable[[JobQueue, Job], Any], str]] = [
    ("complete with a lone surrogate", lambda q, j: q.complete(j, SURROGATE), "lone surrogate"),
    ("complete with a NUL", lambda q, j: q.complete(j, {"k": "\x00"}), "NUL"),
    ("complete with a result over the size limit",
     lambda q, j: q.complete(j, "x" * OVER_LIMIT), f"the limit is {OVER_LIMIT - 1}"),
    ("fail with a lone surrogate in the message",
     lambda q, j: q.fail(j, ValueError(SURROGATE)), "lone surrogate"),
    ("fail with a NUL in the message", lambda q, j: q.fail(j, ValueError("a\x00b")), "NUL"),
]


@pytest.mark.parametrize(("case", "call", "needle"), FINISH_CASES, ids=[c[0] for c in FINISH_CASES])
def test_complete_and_fail_refuse_what_postgresql_cannot_store_and_the_session_stays_usable(
    engine: Engine, session: Session, case: str, call: Callable[[JobQueue, Job], Any], needle: str
) -> None:
    q, job = _checked_out(session)
    with pytest.raises(InvalidArgument, match=needle):
        call(q, job)
    q.complete(job, "fine")  # nothing was written: the job is still ours to finish
    q.enqueue(echo, "after")
    session.commit()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status::text, results FROM postjob.jobs ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("ok", ["fine"]), ("ready", None)]


def test_resolve_refuses_a_lone_surrogate(engine: Engine, session: Session) -> None:
    with engine.begin() as conn:
        job_id = conn.execute(text("INSERT INTO postjob.postjobs (workflow, args, max_attempts) "
                                   "VALUES ('__manual__', '[\"ok?\"]', 1) RETURNING id")).scalar_one()
        token = conn.execute(text("SELECT postjob.manual_token(:i)::text"), {"i": job_id}).scalar_one()
    q = JobQueue(session)
    with pytest.raises(InvalidArgument, match="lone surrogate"):
        q.resolve(token, SURROGATE)
    assert q.resolve(token, "yes") == job_id
    session.commit()


# -- what PostgreSQL stores round-trips ------------------------------------------------------


def test_a_backslash_before_u0000_is_stored_not_taken_for_a_nul(engine: Engine, session: Session) -> None:
    """The JSON of this string holds the characters \\\\u0000 (an escaped backslash): no NUL."""
    q = JobQueue(session, registry=reg, fast_mode=True)
    value = {"path": BACKSLASH_U0000, BACKSLASH_U0000: [BACKSLASH_U0000, "\\\\u0000"]}
    by_api = q.enqueue(echo, value, tags={"path": BACKSLASH_U0000}).id
    ran = q.enqueue(echo, value).id
    session.commit()
    assert q.drain() == 2
    q2, job = _checked_out(session)
    q2.complete(job, value)
    session.commit()
    with engine.connect() as conn:
        rows = {r[0]: r for r in conn.execute(text(
            "SELECT id, args, tags, results, status::text FROM postjob.jobs"))}
    assert rows[by_api][1] == [value] and rows[by_api][2] == {"path": BACKSLASH_U0000}
    assert rows[ran][3] == [value] and rows[ran][4] == "ok"  # the worker stored the result
    assert rows[job.id][3] == [value]


# -- types JSON has no value for -----------------------------------------------------------

TYPE_CASES: list[tuple[Any, str]] = [
    (Decimal("19.99"), "a Decimal is not JSON: use str(value), and Decimal(text) "
                       "to read it back"),
    (datetime(2030, 1, 2, 3, 4, tzinfo=UTC),
     "a datetime is not JSON: use value.isoformat(), and datetime.fromisoformat(text) "
     "to read it back"),
    (date(2030, 1, 2), "a date is not JSON: use value.isoformat(), and "
                       "date.fromisoformat(text) to read it back"),
    (uuid.UUID(int=7), "a UUID is not JSON: use str(value), and uuid.UUID(text) to read "
                       "it back"),
    ({1, 2}, "a set is not JSON: use a list, e.g. sorted(value)"),
    (b"raw", "bytes are not JSON: use text, e.g. base64.b64encode(value).decode()"),
    # any other type by its name, with its article: an object, an ellipsis, a complex
    (object(), "an object is not JSON (JSON has strings, numbers, booleans, null, lists, and "
               "objects with string keys)"),
    (..., "an ellipsis is not JSON (JSON has strings, numbers, booleans, null, lists, and "
          "objects with string keys)"),
    (1j, "a complex is not JSON (JSON has strings, numbers, booleans, null, lists, and "
         "objects with string keys)"),
]


@pytest.mark.parametrize(("value", "message"), TYPE_CASES, ids=[type(v).__name__ for v, _ in TYPE_CASES])
def test_common_types_json_lacks_are_refused_with_how_to_pass_them(
    session: Session, value: Any, message: str
) -> None:
    q = JobQueue(session, registry=reg)
    with pytest.raises(InvalidArgument) as caught:
        q.enqueue(echo, {"nested": [value]})
    assert str(caught.value) == f"args cannot be stored as JSON: {message}"


def test_a_workflow_returning_a_decimal_fails_with_how_to_return_it(engine: Engine, session: Session) -> None:
    r = Registry()
    postjob_sa.workflow(name="store.price", registry=r)(lambda: Decimal("1.50"))
    q = JobQueue(session, registry=r, fast_mode=True)
    job_id = q.enqueue("store.price").id
    session.commit()
    assert q.drain() == 1
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status::text, error, error_message FROM postjob.jobs "
                                "WHERE id = :i"), {"i": job_id}).one()
    assert tuple(row) == (
        "failed", "postjob_sa.errors.ResultNotJSON",
        "the workflow returned a value that cannot be stored as JSON: a Decimal is not JSON: "
        "use str(value), and Decimal(text) to read it back",
    )
