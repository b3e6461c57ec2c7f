"""Which schema revisions a worker of this code works on: its own, and newer ones that still
serve it (the schema's ``oldest_served_code()``), so "migrate, then roll the workers" never
stops the queue. An older schema is refused with the command that fixes it.

A newer schema is simulated in this module's scratch database by replacing
``postjob.schema_version()`` and ``postjob.oldest_served_code()``; each test puts them back."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry, SchemaError
from postjob_sa._migrations import MIGRATE_HINT, head_revision
from postjob_sa.cli import main
from tests.conftest import dbapi_connect, url_string

reg = Registry()
HEAD = head_revision()
#: What the schema at head says it serves: the code of the release before (pj0009 on: pj0008;
#: pj0002 to pj0007 said pj0001, which pj0004's 'cancelled' made untrue).
HEAD_SERVES = "pj0008"

#: The statements that make the schema say a revision (the server quotes it: %L).
SAY_VERSION = ("SELECT format('CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text "
               "LANGUAGE sql IMMUTABLE AS $f$ SELECT %L::text $f$', CAST(:v AS text))")
SAY_OLDEST_SERVED = ("SELECT format('CREATE OR REPLACE FUNCTION postjob.oldest_served_code() "
                     "RETURNS text LANGUAGE sql IMMUTABLE AS $f$ SELECT %L::text $f$', "
                     "CAST(:v AS text))")
FORGET_OLDEST_SERVED = "DROP FUNCTION IF EXISTS postjob.oldest_served_code()"

Say = Callable[[str, str | None], None]


@postjob_sa.workflow(name="range.echo", registry=reg)
def echo(value: int) -> int:
    return value


def _say(engine: Engine, version: str, oldest_served: str | None) -> None:
    with engine.connect() as conn:
        statements = [conn.execute(text(SAY_VERSION), {"v": version}).scalar_one()]
        if oldest_served is not None:
            statements.append(
                conn.execute(text(SAY_OLDEST_SERVED), {"v": oldest_served}).scalar_one())
    raw = dbapi_connect(engine.url)
    try:
        with raw.cursor() as cur:
            if oldest_served is None:
                cur.execute(FORGET_OLDEST_SERVED)
            for statement in statements:  # run without parameters: the text is as written
                cur.execute(statement)
    finally:
        raw.close()


@pytest.fixture
def schema(engine: Engine, clean: None) -> Iterator[Say]:
    """``schema(version, oldest_served)`` makes the database say so (None: no
    oldest_served_code(), as pj0001 had not); the schema says the truth again afterwards."""
    yield lambda version, oldest_served: _say(engine, version, oldest_served)
    _say(engine, HEAD, HEAD_SERVES)


def _enqueue(engine: Engine) -> int:
    with Session(engine) as s:
        job_id = JobQueue(s, registry=reg).enqueue(echo, 7).id
        s.commit()
    return job_id


def _status(engine: Engine, job_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT status::text FROM postjob.postjobs WHERE id = :i"),
                                {"i": job_id}).scalar_one())


def _drain(engine: Engine) -> int:
    with Session(engine) as s:
        return JobQueue(s, fast_mode=True, registry=reg).drain()


def test_the_schema_says_what_it_is(engine: Engine) -> None:
    with engine.connect() as conn:
        assert conn.execute(text("SELECT postjob.schema_version(), "
                                 "postjob.oldest_served_code()")).one() == (HEAD, HEAD_SERVES)


@pytest.mark.parametrize(("version", "oldest_served"), [
    (HEAD, HEAD_SERVES),  # its own revision
    ("pj9999", HEAD_SERVES),  # a newer one that still serves older code than this
    ("pj9999", HEAD),  # a newer one whose oldest served code is exactly this
])
def test_a_worker_works_on_its_own_schema_and_a_newer_one_that_serves_it(
    engine: Engine, schema: Say, version: str, oldest_served: str
) -> None:
    schema(version, oldest_served)
    job_id = _enqueue(engine)
    assert _drain(engine) == 1
    assert _status(engine, job_id) == "ok"


@pytest.mark.parametrize(("version", "oldest_served"), [
    ("pj9999", "pj9000"),  # it serves only code newer than this
    ("pj9999", None),  # it says nothing about older code: it serves only its own
])
def test_a_worker_refuses_a_newer_schema_that_no_longer_serves_it(
    engine: Engine, schema: Say, version: str, oldest_served: str | None
) -> None:
    schema(version, oldest_served)
    job_id = _enqueue(engine)
    with pytest.raises(SchemaError) as refused:
        _drain(engine)
    assert str(refused.value) == (
        f"the postjob schema is at revision pj9999, which no longer serves this code "
        f"(written for {HEAD}): upgrade postjob_sa where this runs"
    )
    assert _status(engine, job_id) == "ready"


@pytest.mark.parametrize("oldest_served", [HEAD_SERVES, None])
def test_a_worker_refuses_an_older_schema_with_the_command_that_fixes_it(
    engine: Engine, schema: Say, oldest_served: str | None
) -> None:
    schema("pj0001", oldest_served)
    job_id = _enqueue(engine)
    for run in (_drain, lambda e: JobQueue(Session(e), registry=reg).work(count=1)):
        with pytest.raises(SchemaError) as refused:
            run(engine)
        assert str(refused.value) == (
            f"the postjob schema is at revision pj0001, this code needs {HEAD}: {MIGRATE_HINT}"
        )
        assert "postjob db migrate" in str(refused.value)
    assert _status(engine, job_id) == "ready"


def _cli(capsys: pytest.CaptureFixture[str], engine: Engine, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["--database-url", url_string(engine.url), *args])
    out, err = capsys.readouterr()
    return int(str(exited.value.code)), out, err


def test_the_cli_works_on_a_newer_schema_while_it_serves_this_code(
    engine: Engine, schema: Say, capsys: pytest.CaptureFixture[str]
) -> None:
    schema("pj9999", HEAD_SERVES)
    code, out, _ = _cli(capsys, engine, "ps")
    assert code == 0
    code, out, _ = _cli(capsys, engine, "db", "status")
    assert code == 0
    assert ("state:     newer  (it still serves this code: upgrade postjob_sa where this runs "
            "when you can)") in out.splitlines()

    schema("pj9999", "pj9000")
    code, out, err = _cli(capsys, engine, "ps")
    assert (code, out) == (2, "")
    assert err == ("postjob: the postjob schema is at revision pj9999, which no longer serves "
                   f"this code (written for {HEAD}): upgrade postjob_sa where this runs\n")
    code, out, _ = _cli(capsys, engine, "db", "status")
    assert code == 0
    assert ("state:     too new  (it no longer serves this code: upgrade postjob_sa where this "
            "runs)") in out.splitlines()


def test_db_status_of_an_older_schema_says_to_migrate(
    engine: Engine, schema: Say, capsys: pytest.CaptureFixture[str]
) -> None:
    schema("pj0001", None)
    code, out, _ = _cli(capsys, engine, "db", "status")
    assert code == 0
    assert "state:     behind  (run: postjob db migrate)" in out.splitlines()
