"""One ``DATABASE_URL`` for an app on asyncpg, its worker, the CLI and the dashboard: the CLI
and ``postjob web`` take the app's ``postgresql+asyncpg://`` URL (or psycopg 3's async form)
and connect to the same database with psycopg 3, as ``AsyncJobQueue``'s worker does; ``-v``
says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text

from postjob_sa.cli import main
from tests.cli.test_cli_db import postjob
from tests.cli.test_cli_web import _serve, _status
from tests.conftest import url_string

NOTE = "connects with psycopg 3"


@pytest.fixture(params=["postgresql+asyncpg", "postgresql+psycopg_async"])
def async_url(request: pytest.FixtureRequest, db_url: URL, clean: None) -> str:
    return url_string(db_url.set(drivername=request.param))


def _ok(res: Any) -> str:
    assert res.returncode == 0, res.stderr
    return str(res.stdout)


def test_every_command_takes_the_apps_async_url(db_url: URL, clean: None, engine: Engine) -> None:
    async_url = url_string(db_url.set(drivername="postgresql+asyncpg"))
    status = json.loads(_ok(postjob("db", "status", "--json", url=async_url)))
    assert status["driver"] == "psycopg" and status["state"] == "up to date"
    job_id = int(_ok(postjob("job", "enqueue", "demo.measure", '"four"', url=async_url)))
    run = postjob("run", "--import", "postjob_sa.demo", "--count", "1", "--fast", url=async_url)
    _ok(run)
    jobs = json.loads(_ok(postjob("ps", "--json", url=async_url)))["jobs"]
    assert [(j["workflow"], j["status"]) for j in jobs] == [("demo.measure", "ok")]
    assert jobs[0]["id"] == job_id
    _ok(postjob("ps", "show", str(job_id), url=async_url))
    _ok(postjob("queue", "list", url=async_url))
    _ok(postjob("schedules", url=async_url))
    _ok(postjob("history", "status", url=async_url))
    _ok(postjob("event", "prune", "--older-than", "1d", url=async_url))
    _ok(postjob("reap", url=async_url))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT results FROM postjob.postjobs")).scalar() == [4]


def test_the_environments_database_url_works_too(async_url: str) -> None:
    _ok(postjob("ps", env={"DATABASE_URL": async_url}))


def test_v_says_which_driver_the_cli_uses_instead(async_url: str) -> None:
    quiet = postjob("ps", url=async_url)
    assert NOTE not in quiet.stderr and quiet.returncode == 0, quiet.stderr
    loud = postjob("-v", "ps", url=async_url)
    assert loud.returncode == 0, loud.stderr
    (note,) = [line for line in loud.stderr.splitlines() if NOTE in line]
    assert "postgresql+psycopg://" in note


def test_asyncpgs_ssl_setting_becomes_libpqs(db_url: URL, clean: None) -> None:
    url = url_string(db_url.set(drivername="postgresql+asyncpg").update_query_dict(
        {"ssl": "disable"}))  # beside the URL's own settings (the embedded server's host)
    _ok(postjob("ps", url=url))


def test_another_async_driver_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--database-url", "postgresql+aiopg://u:hunter2@h/db", "ps"])
    assert exited.value.code == 2
    assert "hunter2" not in capsys.readouterr().err


@pytest.fixture
def served(db_url: URL, clean: None) -> Iterator[str]:
    for address, _note in _serve(db_url.set(drivername="postgresql+asyncpg")):
        yield address


def test_postjob_web_serves_the_dashboard_on_the_apps_async_url(served: str) -> None:
    assert _status(served) == 200
    assert _status(served + "jobs") == 200


def test_create_app_takes_the_apps_async_url(db_url: URL, clean: None) -> None:
    from werkzeug.test import Client

    from postjob_sa.web import create_app

    dashboard = create_app(url_string(db_url.set(drivername="postgresql+asyncpg")))
    try:
        assert dashboard.engine.dialect.driver == "psycopg"
        assert Client(dashboard).get("/").status_code == 200
    finally:
        dashboard.engine.dispose()
