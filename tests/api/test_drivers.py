"""Both psycopg drivers, and one clear error for any other: every URL form SQLAlchemy accepts
for psycopg 3 and psycopg2 works for the API and the CLI alike, and means the same driver to
both (a bare ``postgresql://`` is SQLAlchemy's default, psycopg 3 from SQLAlchemy 2.1 on).

The whole suite runs on the driver ``$POSTJOB_TEST_DRIVER`` names (``make test`` runs it on
both); the tests here cross the drivers within one run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, create_engine, event, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, Job, JobQueue
from postjob_sa._db import unsupported_driver
from postjob_sa.cli import main
from tests.cli.test_cli_db import postjob
from tests.conftest import driver_under_test, url_string

pytestmark = pytest.mark.both_drivers

reg = postjob_sa.Registry()


@postjob_sa.workflow(name="drivers.echo", registry=reg)
def echo(value: int) -> int:
    return value


def test_the_suite_runs_on_the_driver_it_was_asked_for(engine: Engine) -> None:
    assert engine.dialect.driver == driver_under_test()


# -- the CLI ---------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg", "postgresql+psycopg2"])
def test_every_url_form_works_for_the_cli_and_means_what_it_means_to_the_app(
    db_url: URL, scheme: str
) -> None:
    url = url_string(db_url.set(drivername=scheme))
    app_engine = create_engine(url)  # what the application gets from the same URL
    try:
        meant = app_engine.dialect.driver
    finally:
        app_engine.dispose()
    res = postjob("db", "status", "--json", url=url)
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert (status["driver"], status["state"]) == (meant, "up to date")
    assert status["database"].startswith(f"{scheme}://")  # the URL as given, not rewritten
    res = postjob("job", "enqueue", "drivers.echo", "7", url=url)
    assert res.returncode == 0, res.stderr
    res = postjob("ps", "--json", url=url)
    assert res.returncode == 0, res.stderr
    assert [j["workflow"] for j in json.loads(res.stdout)["jobs"]][:1] == ["drivers.echo"]


def test_a_bare_postgresql_url_means_psycopg_3_on_sqlalchemy_2_1(db_url: URL) -> None:
    res = postjob("db", "status", url=url_string(db_url.set(drivername="postgresql")))
    assert res.returncode == 0, res.stderr
    assert "driver:    psycopg 3" in res.stdout.splitlines()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("mysql://u:hunter2@h/db", "mysql+mysqldb"),
        ("postgresql+aiopg://u:hunter2@h/db", "postgresql+aiopg"),
        ("postgresql+pg8000://u:hunter2@h/db", "postgresql+pg8000"),
        ("postgres://u:hunter2@h/db", "postgres"),
        ("sqlite:///hunter2.db", "sqlite+pysqlite"),
    ],
)
def test_the_cli_refuses_another_driver_in_one_line_naming_the_supported_ones(
    url: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--database-url", url, "ps"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"postjob: {unsupported_driver(named)}\n"
    assert "postgresql+psycopg:// or postgresql+psycopg2://" in err
    assert "hunter2" not in err.replace("hunter2.db", "")


def test_the_cli_refuses_what_is_not_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--database-url", "::not a url::hunter2", "ps"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "postjob: not a database URL: '::not a url::hunter2'\n"


# -- the API ---------------------------------------------------------------------------------

@pytest.fixture
def sqlite() -> Iterator[tuple[Engine, list[str]]]:
    """An engine of another driver, and every statement it was asked to run."""
    eng = create_engine("sqlite://")
    ran: list[str] = []
    event.listen(eng, "before_cursor_execute",
                 lambda conn, cur, statement, *rest: ran.append(statement))
    yield eng, ran
    eng.dispose()


def test_a_queue_on_another_driver_fails_at_once(sqlite: tuple[Engine, list[str]]) -> None:
    eng, ran = sqlite
    with Session(eng) as s, pytest.raises(InvalidArgument) as refused:
        JobQueue(s)
    assert str(refused.value) == str(unsupported_driver("sqlite+pysqlite"))
    assert ran == []


def test_enqueue_on_another_driver_fails_before_anything_is_written(
    sqlite: tuple[Engine, list[str]]
) -> None:
    eng, ran = sqlite
    with Session(binds={Job: eng}) as s:  # no bind of its own: JobQueue cannot tell yet
        q = JobQueue(s, registry=reg)
        for enqueue in (lambda: q.enqueue(echo, 1), lambda: q.enqueue_many(echo, [[1], [2]])):
            with pytest.raises(InvalidArgument) as refused:
                enqueue()
            assert str(refused.value) == str(unsupported_driver("sqlite+pysqlite"))
    assert ran == []


def test_the_dashboard_on_another_driver_fails_at_once(sqlite: tuple[Engine, list[str]]) -> None:
    from postjob_sa.web import create_app

    eng, ran = sqlite
    for bind in (eng, "postgresql+pg8000://u:hunter2@h/db"):
        with pytest.raises(InvalidArgument) as refused:
            create_app(bind)
        assert "works with PostgreSQL through psycopg 3 or psycopg2" in str(refused.value)
        assert "hunter2" not in str(refused.value)
    assert ran == []


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg", "postgresql+psycopg2"])
def test_every_url_form_works_for_the_api(db_url: URL, scheme: str) -> None:
    eng = create_engine(db_url.set(drivername=scheme))
    try:
        with Session(eng) as s:
            s.execute(text("TRUNCATE postjob.postjobs, postjob.tokens RESTART IDENTITY CASCADE"))
            q = JobQueue(s, fast_mode=True, registry=reg)
            job = q.enqueue(echo, 5)
            s.commit()
            assert q.drain() == 1
            s.expire_all()
            assert (job.status, job.results) == (postjob_sa.Status.ok, [5])
    finally:
        eng.dispose()


# -- the embedded server ----------------------------------------------------------------------

def test_the_embedded_server_gives_a_url_of_either_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from postjob_sa import embedded

    with pytest.raises(InvalidArgument, match="driver must be one of psycopg, psycopg2"):
        embedded.database_url(tmp_path, driver="asyncpg")
    monkeypatch.setattr(embedded, "_server", None)  # a server of this test's own
    try:
        default = embedded.database_url(tmp_path / "pg")
        assert default.startswith("postgresql+psycopg://")
        for url, driver in ((default, "psycopg"),
                            (embedded.database_url(tmp_path / "pg", driver="psycopg2"), "psycopg2")):
            eng = create_engine(url)
            try:
                with eng.connect() as conn:
                    assert conn.execute(text("SELECT 1")).scalar() == 1
                assert eng.dialect.driver == driver
            finally:
                eng.dispose()
    finally:
        server = embedded._server
        if server is not None:
            server.cleanup()
