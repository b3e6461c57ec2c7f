"""The bad-input catalogue of docs/operations.md quotes the API's messages: for each row named
here, every message the row quotes (in double quotes, in its API column) is what the call
raises, warns or records. "…" in a quote stands for any text, a number for any number."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import Job, JobQueue, Registry, Status
from postjob_sa._migrations import check_revision, schema_error
from postjob_sa.context import ChildHandle, RunningJob, _RunContext
from postjob_sa.worker import unknown
from tests.conftest import end_by_hand

ROOT = Path(__file__).resolve().parents[2]
SURROGATE = os.fsdecode(b"\xff")

reg = Registry()


@postjob_sa.workflow(name="catalogue.stored", registry=reg)
def stored(value: Any) -> Any:
    return value


@postjob_sa.workflow(name="catalogue.poison", registry=reg)
def poison() -> str:
    return SURROGATE


class NotJSON:
    pass


def _rows() -> dict[str, str]:
    """The catalogue's rows: first cell -> API cell."""
    page = (ROOT / "docs" / "operations.md").read_text()
    table = page.split("## Bad input", 1)[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.split(" | ")]
        if line.startswith("| ") and len(cells) >= 4:
            rows[cells[0].removeprefix("| ")] = cells[1]
    return rows


def _pattern(quote: str) -> re.Pattern[str]:
    """A quote of the page as a pattern: markdown escapes undone, … any text, numbers any number."""
    quote = quote.replace("\\`", "`").replace("\\\\", "\\")
    parts = [re.escape(p) for p in quote.split("…")]
    return re.compile(re.sub(r"\d+", r"\\d+", ".*".join(parts)))


def _raised(call: Callable[[], Any]) -> str:
    """What the call says: the message it raises, or the text it returns."""
    try:
        said = call()
    except Exception as exc:
        return str(exc)
    assert isinstance(said, str), f"{call} neither raised nor returned a message"
    return said


def _send_in(module: str) -> Callable[..., Any]:
    def send(*args: Any) -> None:
        pass

    send.__module__, send.__qualname__ = module, "send"
    return send


def _two_sends() -> None:
    r = Registry()
    postjob_sa.workflow(name="send", registry=r)(_send_in("billing"))
    postjob_sa.workflow(name="send", registry=r)(_send_in("mail"))


def _transactional_without_session() -> None:
    def send() -> None:
        pass

    send.__module__, send.__qualname__ = "app", "send"
    postjob_sa.workflow(name="app.send", transactional=True, registry=Registry())(send)


def _script_warning(tmp: Path) -> str:
    (tmp / "tasks.py").write_text("import postjob_sa\n\n\n@postjob_sa.workflow\ndef ping():\n    pass\n")
    res = subprocess.run([sys.executable, "tasks.py"], cwd=tmp, capture_output=True, text=True,
                         timeout=60, check=False)
    return res.stderr


class _OldSchema(Exception):
    sqlstate = "42883"  # undefined_function, as on a schema older than the code


def _workflow_result(engine: Engine) -> str:
    with Session(engine) as s:
        q = JobQueue(s, registry=reg, fast_mode=True)
        job_id = q.enqueue(poison).id
        s.commit()
        q.drain()
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT error_message FROM postjob.jobs WHERE id = :i"),
                                {"i": job_id}).scalar_one())


def _running_job(engine: Engine) -> int:
    """A job checked out (processing) by a worker of its own."""
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        job_id = q.enqueue(stored, "running").id
        s.commit()
        assert [j.id for j in q.checkout(["catalogue.stored"])] == [job_id]
        s.commit()
    return job_id


def _key_taken(engine: Engine) -> int:
    """A failed job whose unique key a newer unfinished job holds."""
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        old = q.enqueue(stored, "old", unique_key="nightly").id
        end_by_hand(s, old)
        q.enqueue(stored, "newer", unique_key="nightly")
        s.commit()
    return old


def _handle() -> ChildHandle:
    job = RunningJob(7, None, "app.parent", "", [], "q", 7, "7", None)
    return ChildHandle(_RunContext(job, db=None), ("catalogue.stored", "[]"))


def _cases(q: JobQueue, engine: Engine, tmp: Path) -> dict[str, list[Callable[[], Any]]]:
    over_limit = "x" * (postjob_sa._json.MAX_DOCUMENT_BYTES + 1)
    token = uuid.uuid4()
    return {
        "args that are not JSON (objects, `NaN`)": [lambda: q.enqueue(stored, NotJSON())],
        "a `Decimal`, `datetime`, `date`, `UUID`, set or bytes in args, tags or a result": [
            lambda: q.enqueue(stored, Decimal("1.5")),
            lambda: q.enqueue(stored, datetime.now(UTC)),
            lambda: q.enqueue(stored, uuid.uuid4()),
        ],
        "a lone surrogate (`os.fsdecode(b\"\\xff\")`) or a NUL in args, tags, a result "
        "(`complete`, `resolve`) or an error message (`fail`, `resolve(token, error=...)`)": [
            lambda: q.enqueue(stored, SURROGATE),
            lambda: q.enqueue(stored, "\x00"),
            lambda: q.fail(Job(), ValueError(SURROGATE)),
            lambda: q.resolve(token, error="no\x00"),
        ],
        "a lone surrogate in a workflow name, queue, version or tag name": [
            lambda: q.enqueue(stored, 1, queue=SURROGATE)],
        "a result over 128 MiB of JSON (`complete`, `resolve`)": [
            lambda: q.resolve(token, over_limit)],
        "a workflow result that cannot be stored (not JSON, a lone surrogate, a NUL, too big)": [
            lambda: _workflow_result(engine)],
        "a `resolve` result that is not JSON": [lambda: q.resolve(token, NotJSON())],
        "an unknown workflow": [lambda: unknown.warning_text([("__main__.ping", 3)])],
        "args that do not fit the workflow's function, where this process has it (a "
        "workflow, or the name of one registered here)": [
            lambda: q.enqueue(stored), lambda: q.enqueue("catalogue.stored", 1, 2)],
        "a function that is not a workflow, passed to `enqueue`": [
            lambda: q.enqueue(_send_in("app"), 1)],  # type: ignore[arg-type]
        "`enqueue(\"__manual__\")`": [lambda: q.enqueue("__manual__")],
        "two functions registered under one workflow name": [_two_sends],
        "a workflow defined in a script run directly (`python tasks.py`), without `name=`": [
            lambda: _script_warning(tmp)],
        "`transactional=True` on a function without a parameter for the Session": [
            _transactional_without_session],
        "`JobQueue(engine)`": [lambda: JobQueue(engine)],  # type: ignore[arg-type]
        "enqueue (or any `JobQueue` call) before the schema is installed, or on an older one": [
            lambda: check_revision(None),
            lambda: str(schema_error(_OldSchema("function postjob.checkout_v2 does not exist"))),
        ],
        "`job.result()` of a job that has not ended `ok` (the enqueued `Job`, a Celery habit)": [
            lambda: Job(id=7, status=Status.ready).result(),
            lambda: Job(id=7, status=Status.failed, error="ValueError", error_message="boom").result(),
        ],
        "a child handle (`spawn`, `manual`) used after its workflow's run": [
            lambda: _handle().result()],
        "`reset` of a running (`processing`) job": [lambda: q.reset(_running_job(engine))],
        "`reset` of a finished job whose `unique_key` a newer unfinished job holds (itself or a "
        "descendant it would bring back)": [lambda: q.reset(_key_taken(engine))],
    }


def test_the_catalogue_quotes_what_the_api_says(engine: Engine, clean: None, tmp_path: Path) -> None:
    rows = _rows()
    with Session(engine) as s:
        cases = _cases(JobQueue(s, registry=reg), engine, tmp_path)
        for label, calls in cases.items():
            assert label in rows, f"no row {label!r} in the catalogue"
            said = [_raised(call) for call in calls]
            for quote in re.findall(r'"([^"]+)"', rows[label]):
                pattern = _pattern(quote)
                assert any(pattern.search(s) for s in said), (label, quote, said)
            s.rollback()


@pytest.mark.parametrize("label", ["the same child enqueued twice (`enqueue(..., parent_id=7)`, same workflow and args)",
                                   "`job enqueue` without `--import`"])
def test_rows_without_an_api_message_are_there(label: str) -> None:
    assert label in _rows()
