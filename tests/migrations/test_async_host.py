"""The async stack: an app made with `alembic init -t async`, its URL postgresql+asyncpg://,
applies and undoes our revisions (the revision `postjob db revision` writes) with its own
`alembic upgrade head` / `alembic downgrade base`; `postjob_sa.migrate()` takes an asyncpg URL
or an AsyncEngine. Real Alembic, real asyncpg, real subprocesses."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, create_engine, inspect
from sqlalchemy.ext.asyncio import create_async_engine

import postjob_sa
from postjob_sa._migrations import head_revision, installed_revision
from tests.cli.test_cli_db import postjob
from tests.conftest import create_clone, drop_database

ALEMBIC = str(Path(sys.executable).parent / "alembic")
DOCS = Path(__file__).parents[2] / "docs" / "integrating.md"
#: The first line of the env.py function the docs show for an async app.
DOCS_FUNCTION = "def do_run_migrations(connection: Connection) -> None:"


@pytest.fixture
def fresh_db(server_url: URL, template_db: str) -> Iterator[URL]:
    """An empty database (no postjob schema)."""
    url = create_clone(server_url, "template0", "async_host")
    yield url
    drop_database(server_url, url)


def asyncpg_url(url: URL) -> str:
    return url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def installed(url: URL) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return installed_revision(conn)
    finally:
        engine.dispose()


def alembic(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([ALEMBIC, *args], cwd=project, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in res.stderr.splitlines() if "Error" in ln or "FAILED" in ln]
    assert res.returncode == 0, "\n".join(errors) or res.stderr[-3000:]
    return res


def docs_env_function() -> str:
    """The do_run_migrations() that docs/integrating.md tells an async app to have."""
    text = DOCS.read_text()
    start = text.index(DOCS_FUNCTION)
    end = text.index("```", start)
    return text[start:end]


def async_project(root: Path, url: str) -> Path:
    """What `alembic init -t async migrations` makes (the installed Alembic's own template),
    its env.py edited as the docs say, its URL the given one."""
    res = subprocess.run([ALEMBIC, "init", "-t", "async", "migrations"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    ini = root / "alembic.ini"
    # the ini is read with interpolation: a % of the URL (the embedded server's socket folder
    # is percent-encoded in it) is written %%, as Alembic's own docs say
    escaped = url.replace("%", "%%")
    ini.write_text(re.sub(r"(?m)^sqlalchemy\.url = .*$", lambda _: f"sqlalchemy.url = {escaped}",
                          ini.read_text()))
    env = root / "migrations" / "env.py"
    template = env.read_text()
    function = re.compile(r"(?ms)^def do_run_migrations\(.*?(?=^\S)")
    assert function.search(template), template
    edited = function.sub(lambda _: docs_env_function().rstrip() + "\n\n\n", template)
    env.write_text("import postjob_sa\n" + edited)
    return root


def test_alembic_upgrade_and_downgrade_on_asyncpg(fresh_db: URL, tmp_path: Path) -> None:
    project = async_project(tmp_path, asyncpg_url(fresh_db))
    res = postjob("db", "revision", "--rev-id", "app0001", cwd=project)
    assert res.returncode == 0, res.stderr
    assert f"nothing -> {head_revision()}" in res.stdout
    offline = alembic(project, "upgrade", "head", "--sql").stdout  # the same script as ever
    assert "CREATE SCHEMA IF NOT EXISTS postjob;" in offline

    alembic(project, "upgrade", "head")
    assert installed(fresh_db) == head_revision()
    engine = create_engine(fresh_db)
    with engine.connect() as conn:
        assert "alembic_version" in inspect(conn).get_table_names()
    engine.dispose()

    alembic(project, "downgrade", "base")
    assert installed(fresh_db) is None
    alembic(project, "upgrade", "head")  # and again: nothing of the first round is left
    assert installed(fresh_db) == head_revision()


def test_up_and_down_in_steps_on_asyncpg(fresh_db: URL, tmp_path: Path) -> None:
    """Three revisions of the app, each one more postjob_sa release: an upgrade that finds
    our schema installed goes on from there, a downgrade to one of ours stops there."""
    project = async_project(tmp_path, asyncpg_url(fresh_db))
    ours = postjob_sa._migrations.revisions()
    steps = [ours[0], ours[len(ours) // 2], ours[-1]]
    for i, rev in enumerate(steps, start=1):
        res = postjob("db", "revision", "--to", rev, "--rev-id", f"app{i:04d}", cwd=project)
        assert res.returncode == 0, res.stderr
    for rev in steps:
        alembic(project, "upgrade", "+1")
        assert installed(fresh_db) == rev
    for rev in reversed(steps[:-1]):
        alembic(project, "downgrade", "-1")
        assert installed(fresh_db) == rev
    alembic(project, "downgrade", "base")
    assert installed(fresh_db) is None


def test_migrate_takes_an_asyncpg_url(fresh_db: URL) -> None:
    postjob_sa.migrate(asyncpg_url(fresh_db))
    assert installed(fresh_db) == head_revision()
    postjob_sa.migrate(asyncpg_url(fresh_db))  # idempotent
    postjob_sa._migrations.downgrade(asyncpg_url(fresh_db))
    assert installed(fresh_db) is None


def test_migrate_takes_an_async_engine(fresh_db: URL) -> None:
    engine = create_async_engine(asyncpg_url(fresh_db))
    postjob_sa.migrate(engine)
    assert installed(fresh_db) == head_revision()

    async def app_uses_its_engine() -> str | None:
        # the app's own loop and pool: migrate() left nothing in them of another loop
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(installed_revision)
        finally:
            await engine.dispose()

    assert asyncio.run(app_uses_its_engine()) == head_revision()
    postjob_sa._migrations.downgrade(engine)
    assert installed(fresh_db) is None


def test_migrate_an_async_engine_from_inside_a_running_loop(fresh_db: URL) -> None:
    """An app's startup (a FastAPI lifespan) calls it on its own engine, in its loop."""

    async def startup() -> str | None:
        engine = create_async_engine(asyncpg_url(fresh_db))
        try:
            async with engine.connect() as conn:  # the app has used its engine already
                await conn.run_sync(installed_revision)
            postjob_sa.migrate(engine)
            async with engine.connect() as conn:
                return await conn.run_sync(installed_revision)
        finally:
            await engine.dispose()

    assert asyncio.run(startup()) == head_revision()
