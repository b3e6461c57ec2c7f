"""The example apps end to end, the way docs/integrating.md says to run them: the app's own
`alembic upgrade head` (FastAPI: the single-head way) or `alembic upgrade heads` (Flask: the
branch way), a POST through the framework's test client, then the worker."""

from __future__ import annotations

import base64
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import URL, Engine, create_engine, func, inspect, select, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import Job, SchemaError, Status
from postjob_sa._migrations import installed_revision
from tests.conftest import drop_database, url_string

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Example:
    name: str
    revision: str  # the app's head
    upgrade: str  # what its deploy runs: `alembic upgrade head` or `heads`
    post: Callable[[Any, dict[str, Any]], tuple[int, Any]]

    def module(self, part: str) -> ModuleType:
        return importlib.import_module(f"examples.{self.name}.{part}")

    @property
    def alembic_ini(self) -> Path:
        return ROOT / "examples" / self.name / "alembic.ini"


def _flask_post(app: Any, body: dict[str, Any]) -> tuple[int, Any]:
    resp = app.test_client().post("/signups", json=body)
    return resp.status_code, resp.get_json()


def _fastapi_post(app: Any, body: dict[str, Any]) -> tuple[int, Any]:
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        resp = client.post("/signups", json=body)
    return resp.status_code, resp.json()


EXAMPLES = [
    Example("flask_app", "flask0001", "heads", _flask_post),
    Example("fastapi_app", "fastapi0011", "head", _fastapi_post),
]


@pytest.fixture(params=EXAMPLES, ids=lambda e: e.name)
def example(request: pytest.FixtureRequest) -> Example:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def app_db(server_url: URL, example: Example, monkeypatch: pytest.MonkeyPatch) -> Iterator[URL]:
    """An empty database for the example; DATABASE_URL points at it, as in production."""
    url = server_url.set(database=f"pjt_example_{example.name}")
    drop_database(server_url, url)
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    admin.dispose()
    monkeypatch.setenv("DATABASE_URL", url_string(url))
    yield url
    drop_database(server_url, url)


@pytest.fixture
def app_engine(app_db: URL, example: Example) -> Iterator[Engine]:
    command.upgrade(Config(str(example.alembic_ini)), example.upgrade)
    engine = create_engine(app_db)
    yield engine
    engine.dispose()


def _jobs(engine: Engine) -> list[Job]:
    with Session(engine) as s:
        return list(s.scalars(select(Job).order_by(Job.id)))


def test_upgrade_applies_our_schema_and_the_app_revision(app_engine: Engine, example: Example) -> None:
    with app_engine.connect() as conn:
        # the app's revision depends on our branch's first revision; later ones of ours are a
        # head of their own (as in tests/migrations/test_host_project.py)
        heads = set(MigrationContext.configure(conn).get_current_heads())
        assert example.revision in heads
        assert heads <= {example.revision, postjob_sa._migrations.head_revision()}
        assert installed_revision(conn) == postjob_sa._migrations.head_revision()
        models = example.module("models")
        ctx = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_object": postjob_sa.include_object,
                "target_metadata": models.Base.metadata,
            },
        )
        assert compare_metadata(ctx, models.Base.metadata) == []


def test_signup_enqueues_in_the_request_transaction(app_engine: Engine, example: Example) -> None:
    app = example.module("app").create_app(app_engine)
    Signup = example.module("models").Signup

    status, body = example.post(app, {"email": "ada@example.com"})
    assert status == 201, body
    [job] = _jobs(app_engine)
    assert body["welcome_job_id"] == job.id
    assert job.status is Status.ready
    assert job.args == ["ada@example.com"]

    # the same email again: the enqueue ran, then the signup's INSERT failed the commit;
    # the rollback took the job with it
    status, body = example.post(app, {"email": "ada@example.com"})
    assert status == 409, body
    # rejected before any write
    status, body = example.post(app, {"email": "not an address"})
    assert status == 400, body
    assert [j.id for j in _jobs(app_engine)] == [job.id]

    # the worker's management command, in drain mode
    assert example.module("worker").main(["--drain"]) == 1
    [done] = _jobs(app_engine)
    assert done.status is Status.ok, (done.error, done.error_message)
    assert done.result() == "ada@example.com"
    with Session(app_engine) as s:
        signup = s.scalars(select(Signup)).one()
        assert signup.welcome_job_id == job.id
        assert signup.welcomed_at is not None
        assert s.scalar(select(func.count()).select_from(Signup)) == 1


class _FlaskBrowser:
    def __init__(self, app: Any):
        self.client = app.test_client()

    def get(self, path: str, auth: dict[str, str]) -> tuple[int, str]:
        resp = self.client.get(path, headers=auth)
        return resp.status_code, resp.get_data(as_text=True)

    def post(self, path: str, auth: dict[str, str]) -> tuple[int, str]:
        cookie = self.client.get_cookie("postjob_csrf", path="/admin/jobs/")
        resp = self.client.post(path, headers=auth, data={"csrf": cookie.value if cookie else ""})
        return resp.status_code, resp.headers.get("Location", "")


class _FastAPIBrowser:
    def __init__(self, app: Any):
        from fastapi.testclient import TestClient

        self.client = TestClient(app, follow_redirects=False)
        self.client.__enter__()  # one event loop for every request (the app's lifespan)

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def get(self, path: str, auth: dict[str, str]) -> tuple[int, str]:
        resp = self.client.get(path, headers=auth)
        return resp.status_code, resp.text

    def post(self, path: str, auth: dict[str, str]) -> tuple[int, str]:
        resp = self.client.post(path, headers=auth, data={"csrf": self.client.cookies.get("postjob_csrf") or ""})
        return resp.status_code, resp.headers.get("location", "")


def test_the_dashboard_is_mounted_behind_the_apps_authentication(
    app_engine: Engine, example: Example, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADMIN_PASSWORD", "s3cret")
    app = example.module("app").create_app(app_engine)
    assert example.post(app, {"email": "ada@example.com"})[0] == 201
    [job] = _jobs(app_engine)
    browser = _FlaskBrowser(app) if example.name == "flask_app" else _FastAPIBrowser(app)
    admin = {"Authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()}
    wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:guess").decode()}

    assert browser.get("/admin/jobs/", {})[0] == 401
    assert browser.get("/admin/jobs/", wrong)[0] == 401
    status, page = browser.get("/admin/jobs/", admin)
    assert status == 200 and "Overview" in page
    assert 'href="/admin/jobs/static/dashboard.css' in page
    status, page = browser.get(f"/admin/jobs/jobs/{job.id}", admin)
    assert status == 200 and "ada@example.com" in page and "send_welcome" in page
    # an action through the mount: the app's authentication, then the dashboard's CSRF check
    assert browser.post(f"/admin/jobs/jobs/{job.id}/force", {})[0] == 401
    status, location = browser.post(f"/admin/jobs/jobs/{job.id}/force", admin)
    assert status == 303 and location.endswith(f"/admin/jobs/jobs/{job.id}?done=force")
    if isinstance(browser, _FastAPIBrowser):
        browser.close()


def test_worker_runs_as_a_module(app_engine: Engine, example: Example) -> None:
    app = example.module("app").create_app(app_engine)
    assert example.post(app, {"email": "grace@example.com"})[0] == 201
    out = subprocess.run(
        [sys.executable, "-m", f"examples.{example.name}.worker", "--drain"],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "ran 1 jobs" in out.stderr
    assert [j.status for j in _jobs(app_engine)] == [Status.ok]


def test_adopting_alembic_after_migrate(app_db: URL, example: Example) -> None:
    """docs/integrating.md, "Apps without Alembic": an app that used postjob_sa.migrate()
    adopts its own Alembic history. The single-head way needs no extra step (the app's
    revision finds the schema installed and takes it over); the branch way stamps our branch
    and drops our version table once."""
    postjob_sa.migrate(url_string(app_db))
    cfg = Config(str(example.alembic_ini))
    engine = create_engine(app_db)
    try:
        if example.upgrade == "heads":
            command.stamp(cfg, "postjob@head")
            with engine.begin() as conn:
                conn.execute(text("DROP TABLE postjob_alembic_version"))
        command.upgrade(cfg, example.upgrade)
        with engine.connect() as conn:
            assert example.revision in MigrationContext.configure(conn).get_current_heads()
            assert conn.execute(text("SELECT count(*) FROM signups")).scalar() == 0
            assert not inspect(conn).has_table("postjob_alembic_version")
        with pytest.raises(SchemaError, match="managed by your app's Alembic"):
            postjob_sa.migrate(engine)
    finally:
        engine.dispose()
