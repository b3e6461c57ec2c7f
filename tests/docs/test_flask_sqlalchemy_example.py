"""examples/flask_sqlalchemy_app end to end, as its users run it: `flask db upgrade` (Flask-Migrate,
the single-head way), a POST that enqueues through ``JobQueue(db.session)`` in the request's
transaction, the worker with the app's context (`flask jobs work`, `postjob run --app`), `postjob
db revision` on Flask-Migrate's layout, offline SQL, and the way back down."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, select, text
from sqlalchemy.orm import Session

from postjob_sa import Job, Status
from postjob_sa._migrations import head_revision, installed_revision
from tests.cli.test_cli_db import postjob
from tests.conftest import drop_database, url_string

ROOT = Path(__file__).resolve().parents[2]
APP = "examples.flask_sqlalchemy_app.app"
MIGRATIONS = ROOT / "examples" / "flask_sqlalchemy_app" / "migrations"
FLASK = str(Path(sys.executable).parent / "flask")
#: the app's head: our schema to pj0007, the signups, our schema to pj0008 (a later release)
HEAD = "fsqla0006"


@pytest.fixture
def app_db(server_url: URL, monkeypatch: pytest.MonkeyPatch) -> Iterator[URL]:
    """An empty database; DATABASE_URL points at it, as in production."""
    url = server_url.set(database=f"pjt_{os.getpid()}_fsqla")
    drop_database(server_url, url)
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    admin.dispose()
    monkeypatch.setenv("DATABASE_URL", url_string(url))
    yield url
    drop_database(server_url, url)


def flask(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLASK, "--app", APP, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def upgraded(app_db: URL) -> Iterator[Engine]:
    res = flask("db", "upgrade")
    assert res.returncode == 0, res.stderr
    engine = create_engine(app_db)
    yield engine
    engine.dispose()


def _jobs(engine: Engine) -> list[Job]:
    with Session(engine) as s:
        return list(s.scalars(select(Job).order_by(Job.id)))


def _signups(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT email, welcomed_by, welcome_job_id FROM signups")))


def test_flask_db_upgrade_installs_our_schema_and_finds_nothing_to_autogenerate(
    upgraded: Engine,
) -> None:
    with upgraded.connect() as conn:
        assert installed_revision(conn) == head_revision()
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
    res = flask("db", "check")  # include_object keeps autogenerate to the app's own tables
    assert res.returncode == 0, res.stderr
    assert "No new upgrade operations detected" in res.stdout + res.stderr


def _post(email: str) -> tuple[int, Any]:
    """A request to a new app (each makes its engine: disposed after, as at shutdown)."""
    from examples.flask_sqlalchemy_app.app import create_app
    from examples.flask_sqlalchemy_app.models import db

    app = create_app()
    try:
        resp = app.test_client().post("/signups", json={"email": email})
        return resp.status_code, resp.get_json()
    finally:
        with app.app_context():
            db.engine.dispose()


def test_a_signup_enqueues_in_the_requests_transaction_and_the_worker_has_the_app(
    upgraded: Engine,
) -> None:
    status, body = _post("ada@example.com")
    assert status == 201, body
    [job] = _jobs(upgraded)
    assert body["welcome_job_id"] == job.id and job.status is Status.ready
    # the same email: the signup's INSERT fails before the enqueue; nothing is left behind
    status, body = _post("ada@example.com")
    assert status == 409, body
    assert [j.id for j in _jobs(upgraded)] == [job.id]

    # the app's worker command: each job inside the app's context (db.session, current_app)
    res = flask("jobs", "work", "--drain")
    assert res.returncode == 0, res.stderr
    assert "ran 1 jobs" in res.stdout
    [done] = _jobs(upgraded)
    assert done.status is Status.ok, (done.error, done.error_message)
    assert _signups(upgraded) == [("ada@example.com", "welcome@example.com", job.id)]


def test_postjob_run_app_runs_each_job_inside_the_app_context(app_db: URL, upgraded: Engine) -> None:
    for email in ("bo@example.com", "cy@example.com"):
        assert _post(email)[0] == 201
    res = postjob("run", "--app", f"{APP}:create_app", "--count", "2", url=url_string(app_db),
                  env={"DATABASE_URL": url_string(app_db)}, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert {j.status for j in _jobs(upgraded)} == {Status.ok}
    assert {s.welcomed_by for s in _signups(upgraded)} == {"welcome@example.com"}


def test_without_the_app_context_the_workflow_cannot_use_the_app(app_db: URL, upgraded: Engine) -> None:
    """What --app is for: the same worker without it fails the job on "Working outside of
    application context"."""
    assert _post("di@example.com")[0] == 201
    res = postjob("run", "--import", "examples.flask_sqlalchemy_app.workflows", "--count", "1",
                  url=url_string(app_db), env={"DATABASE_URL": url_string(app_db)}, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    [job] = _jobs(upgraded)
    assert job.status is Status.err and "outside of application context" in (job.error_message or "")


def test_postjob_db_revision_writes_into_flask_migrates_layout(tmp_path: Path) -> None:
    """Flask-Migrate's alembic.ini has no script_location (Flask-Migrate sets it in code): the
    ini's folder is the migrations directory, or --directory names it."""
    for how in (["--alembic-ini", "{d}/alembic.ini"], ["--directory", "{d}"]):
        target = tmp_path / how[0].strip("-")
        shutil.copytree(MIGRATIONS, target, ignore=shutil.ignore_patterns("__pycache__"))
        for path in (target / "versions").glob("fsqla0001_*.py"):
            path.unlink()
        for later in ("fsqla0002_signups.py", "fsqla0003_postjob_schema_pj0008.py",
                      "fsqla0004_postjob_schema_pj0009.py", "fsqla0005_postjob_schema_pj0010.py",
                      "fsqla0006_postjob_schema_pj0011.py"):
            (target / "versions" / later).unlink()
        res = postjob("db", "revision", how[0], how[1].format(d=target), "--rev-id", "fsqla0001",
                      "--to", "pj0007", url=None)
        assert res.returncode == 0, res.stderr
        [written] = (target / "versions").glob("fsqla0001_*.py")
        [shipped] = (MIGRATIONS / "versions").glob("fsqla0001_*.py")
        assert _body(written) == _body(shipped)


def _body(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if not ln.startswith("Create Date")]


def test_offline_sql_and_the_way_down_and_up_again(upgraded: Engine) -> None:
    res = flask("db", "upgrade", "--sql")
    assert res.returncode == 0, res.stderr
    assert "CREATE SCHEMA IF NOT EXISTS postjob" in res.stdout and "%%" not in res.stdout
    res = flask("db", "downgrade", "base")
    assert res.returncode == 0, res.stderr
    with upgraded.connect() as conn:
        assert installed_revision(conn) is None
    res = flask("db", "upgrade")
    assert res.returncode == 0, res.stderr
    with upgraded.connect() as conn:
        assert installed_revision(conn) == head_revision()

