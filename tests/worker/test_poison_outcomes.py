"""A poison outcome in a batch: a workflow whose result, or whose exception's message, holds a
lone surrogate (what ``os.fsdecode`` gives for a file name that is not UTF-8). The two other
outcomes of the batch are recorded, the poison job ends with a stored, escaped message, and the
worker goes on to the next job."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry

SURROGATE = os.fsdecode(b"file-\xff")  # "file-\udcff"

reg = Registry()


@postjob_sa.workflow(name="poison.echo", registry=reg)
def echo(value: Any) -> Any:
    return value


@postjob_sa.workflow(name="poison.result", registry=reg)
def bad_result() -> str:
    return SURROGATE


@postjob_sa.workflow(name="poison.error", registry=reg, max_attempts=1)
def bad_error() -> None:
    raise FileNotFoundError(SURROGATE)


def _rows(engine: Engine) -> dict[int, tuple[Any, ...]]:
    with engine.connect() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(text(
            "SELECT id, status::text, results, error, error_message FROM postjob.jobs"))}


def _batch_of_three(engine: Engine, poison: postjob_sa.Workflow[Any, Any]) -> tuple[list[int], int]:
    """Enqueue echo, poison, echo, then one more echo; drain with batches of three."""
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True, registry=reg, batch_size=3)
        ids = [q.enqueue(echo, "a").id, q.enqueue(poison).id, q.enqueue(echo, "b").id]
        later = q.enqueue(echo, "after").id
        s.commit()
        assert q.drain() == 4  # the worker went on after the batch
    return ids, later


def test_a_result_with_a_lone_surrogate_fails_its_job_and_no_other(engine: Engine, clean: None) -> None:
    ids, later = _batch_of_three(engine, bad_result)
    rows = _rows(engine)
    assert rows[ids[0]] == ("ok", ["a"], None, None)
    assert rows[ids[2]] == ("ok", ["b"], None, None)
    assert rows[later] == ("ok", ["after"], None, None)
    status, results, error, message = rows[ids[1]]
    assert (status, results, error) == ("failed", None, "postjob_sa.errors.ResultNotJSON")
    assert message == (
        "the workflow returned a value that cannot be stored as JSON: it contains '\\udcff', a "
        "lone surrogate that is not valid Unicode (e.g. a file name decoded with os.fsdecode): "
        "encode or replace it first"
    )


def test_an_error_message_with_a_lone_surrogate_is_stored_escaped(engine: Engine, clean: None) -> None:
    ids, later = _batch_of_three(engine, bad_error)
    rows = _rows(engine)
    assert [rows[i][:2] for i in (ids[0], ids[2], later)] == [("ok", ["a"]), ("ok", ["b"]), ("ok", ["after"])]
    # the job's own error, retried as any error is (here: its only attempt), its text escaped
    assert rows[ids[1]] == ("failed", None, "FileNotFoundError", "file-\\udcff")
