"""The branch way on the async stack: an app made with `alembic init -t async`, its URL
postgresql+asyncpg://, lists our revisions in its `version_locations` as docs/integrating.md
says, applies them with its own `alembic upgrade heads` and removes them with `alembic
downgrade postjob@base`. Real Alembic, real asyncpg, real subprocesses."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, create_engine, inspect

import postjob_sa
from postjob_sa._migrations import head_revision
from tests.conftest import create_clone, drop_database
from tests.migrations.test_async_host import alembic, async_project, asyncpg_url, installed

#: The app's revision: its table references our jobs, so it depends on our branch (the docs'
#: `--depends-on postjob`).
APP_REVISION = '''"""signups

Revision ID: app0001
"""
import sqlalchemy as sa
from alembic import op

revision = "app0001"
down_revision = None
branch_labels = ("app",)
depends_on = "postjob"


def upgrade() -> None:
    op.create_table(
        "signups",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("job_id", sa.BigInteger,
                  sa.ForeignKey("postjob.postjobs.id", ondelete="SET NULL")),
    )


def downgrade() -> None:
    op.drop_table("signups")
'''


@pytest.fixture
def fresh_db(server_url: URL, template_db: str) -> Iterator[URL]:
    """An empty database (no postjob schema)."""
    url = create_clone(server_url, "template0", "async_branch")
    yield url
    drop_database(server_url, url)


def branch_way_project(root: Path, url: str) -> Path:
    """The async app with our revisions in its version_locations (docs/integrating.md,
    "The branch way"), and a revision of its own that depends on our branch."""
    project = async_project(root, url)
    ini = project / "alembic.ini"
    text, found = re.subn(r"(?m)^path_separator\s*=.*$", "path_separator = space",
                          ini.read_text(), count=1)
    assert found, "no path_separator in the template's alembic.ini"
    text, found = re.subn(
        r"(?m)^#\s*version_locations\s*=.*$",
        f"version_locations = %(here)s/migrations/versions {postjob_sa.VERSION_LOCATION}",
        text, count=1)
    assert found, "no version_locations in the template's alembic.ini"
    ini.write_text(text)
    (project / "migrations" / "versions" / "app0001_signups.py").write_text(APP_REVISION)
    return project


def heads(url: URL) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return set()
            return {row[0] for row in conn.exec_driver_sql("SELECT version_num FROM alembic_version")}
    finally:
        engine.dispose()


def test_upgrade_heads_and_downgrade_our_branch_on_asyncpg(fresh_db: URL, tmp_path: Path) -> None:
    project = branch_way_project(tmp_path, asyncpg_url(fresh_db))
    offline = alembic(project, "upgrade", "heads", "--sql").stdout  # the same script as ever
    assert "CREATE SCHEMA IF NOT EXISTS postjob;" in offline
    assert heads(fresh_db) == set()

    alembic(project, "upgrade", "heads")
    assert installed(fresh_db) == head_revision()
    assert heads(fresh_db) == {"app0001", head_revision()}

    alembic(project, "downgrade", "postjob@base")  # the app's revision goes first, as it depends
    assert installed(fresh_db) is None
    assert heads(fresh_db) == set()
    engine = create_engine(fresh_db)
    with engine.connect() as conn:
        assert "postjob" not in inspect(conn).get_schema_names()
        assert not inspect(conn).has_table("signups")
    engine.dispose()

    alembic(project, "upgrade", "heads")  # and again: nothing of the first round is left
    assert installed(fresh_db) == head_revision()
    assert heads(fresh_db) == {"app0001", head_revision()}


def test_upgrade_in_steps_on_asyncpg(fresh_db: URL, tmp_path: Path) -> None:
    """Our branch brought up revision by revision (an app that upgrades postjob_sa release
    after release), then down the same way."""
    project = branch_way_project(tmp_path, asyncpg_url(fresh_db))
    ours = postjob_sa._migrations.revisions()
    alembic(project, "upgrade", f"postjob@{ours[0]}")
    assert installed(fresh_db) == ours[0]
    alembic(project, "upgrade", f"postjob@{ours[len(ours) // 2]}")
    assert installed(fresh_db) == ours[len(ours) // 2]
    alembic(project, "upgrade", "heads")
    assert installed(fresh_db) == head_revision()
    alembic(project, "downgrade", f"postjob@{ours[0]}")
    assert installed(fresh_db) == ours[0]
    alembic(project, "downgrade", "postjob@base")
    assert installed(fresh_db) is None
