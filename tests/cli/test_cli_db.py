"""`postjob db …`, database selection and connection errors, through the installed script."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, create_engine, text

from postjob_sa._migrations import head_revision
from tests.conftest import create_clone, drop_database, url_string

pytestmark = pytest.mark.both_drivers

POSTJOB = str(Path(sys.executable).parent / "postjob")


def postjob(*args: str, url: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("POSTJOB_DATABASE_URL", "DATABASE_URL")}
    argv = [POSTJOB, *(["--database-url", url] if url else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**base, **(env or {}), "COLUMNS": "200"})


def assert_bad_input(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("postjob: ")
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture(scope="module")
def scratch(server_url: URL, template_db: str) -> Iterator[URL]:
    """An empty database (no schema) this module may migrate and downgrade."""
    url = create_clone(server_url, "template0", "cli_db_scratch")
    yield url
    drop_database(server_url, url)


def test_status_of_a_migrated_database(db_url: URL) -> None:
    res = postjob("db", "status", url=url_string(db_url))
    assert res.returncode == 0, res.stderr
    assert f"installed: {head_revision()}" in res.stdout
    assert "state:     up to date" in res.stdout
    res = postjob("db", "status", "--json", url=url_string(db_url).replace("+psycopg2", ""))
    assert '"state": "up to date"' in res.stdout


def test_migrate_status_downgrade_round_trip(scratch: URL) -> None:
    url = url_string(scratch)
    assert "state:     missing" in postjob("db", "status", url=url).stdout
    assert_bad_input(postjob("ps", url=url), "schema is missing", "postjob db migrate")
    assert_bad_input(postjob("db", "downgrade", url=url), "not installed")

    res = postjob("db", "migrate", url=url)
    assert res.returncode == 0 and f"from nothing to {head_revision()}" in res.stdout
    res = postjob("db", "migrate", url=url)
    assert res.returncode == 0 and "up to date" in res.stdout
    assert_bad_input(postjob("db", "downgrade", "nosuchrev", url=url), "nosuchrev")

    res = postjob("db", "downgrade", url=url)
    assert res.returncode == 0 and "schema dropped" in res.stdout
    engine = create_engine(scratch)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = 'postjob'")).scalar() is None
    engine.dispose()


def test_url_from_the_environment(db_url: URL) -> None:
    res = postjob("db", "status", env={"POSTJOB_DATABASE_URL": url_string(db_url)})
    assert res.returncode == 0 and "(POSTJOB_DATABASE_URL)" in res.stdout
    res = postjob("db", "status", env={"DATABASE_URL": url_string(db_url),
                                       "POSTJOB_DATABASE_URL": ""})
    assert res.returncode == 0 and "(DATABASE_URL)" in res.stdout


def test_unreachable_database_hides_the_password() -> None:
    res = postjob("ps", url="postgresql://someone:s3cret-pw@127.0.0.1:1/nowhere")
    assert_bad_input(res, "cannot use the database", "someone:***@127.0.0.1:1")
    assert "s3cret-pw" not in res.stderr
