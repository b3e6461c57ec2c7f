"""One home for the database code: a database migrated to head through the revisions is
exactly what the live files of postjob_sa/sql/ describe (every function's definition, the
tables, columns, constraints, indexes, enum and triggers), and each revision keeps installing
what it installed (its offline SQL is recorded: a change to a live file that a landed revision
reads must freeze that revision's copy first, see postjob_sa/alembic/_sql_files.py)."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import URL, Engine, create_engine

import postjob_sa
from postjob_sa._migrations import VERSION_TABLE
from postjob_sa.alembic import _sql_files
from tests.conftest import create_clone, dbapi_connect, drop_database
from tests.revisions import catalog

HOST = Path(__file__).resolve().parents[1] / "host_project"
DIGESTS = Path(__file__).with_name("revision_sql.json")
#: The revisions, each from the one before (pj0001 from nothing).
REVISIONS = ["pj0001", "pj0002", "pj0003", "pj0004", "pj0005", "pj0006", "pj0007", "pj0008",
             "pj0009", "pj0010", "pj0011"]


@pytest.fixture
def two(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    urls = [create_clone(server_url, "template0", f"sqlhome_{n}") for n in ("migrated", "files")]
    engines = [create_engine(u) for u in urls]
    yield engines[0], engines[1]
    for engine, url in zip(engines, urls, strict=True):
        engine.dispose()
        drop_database(server_url, url)


def _statements(sql: str) -> list[str]:
    """schema.sql's statements (it has no function bodies: a ';' at a line's end ends one)."""
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*$", body, flags=re.MULTILINE) if s.strip()]


def _head_version() -> str:
    """The head revision's own functions that say what it is (a revision's, not a live file's)."""
    from postjob_sa._migrations import scripts

    version = getattr(scripts()[-1].module, "VERSION", None)
    assert isinstance(version, str), "the head revision says what it is (VERSION)"
    return version


def _install_from_files(engine: Engine) -> None:
    """The live files as they are: tables and types, then the functions, then the triggers
    (which name functions), and the head revision's version functions."""
    schema = _statements(_sql_files.live("schema"))
    triggers = [s for s in schema if s.startswith("CREATE TRIGGER")]
    conn = dbapi_connect(engine.url)
    try:
        with conn.cursor() as cur:
            for statement in [s for s in schema if s not in triggers]:
                cur.execute(statement)
            cur.execute("SET check_function_bodies = off")
            for text in _sql_files.live_functions():
                cur.execute(text)
            for statement in triggers:
                cur.execute(statement)
            cur.execute(_head_version())
    finally:
        conn.close()


def test_a_migrated_database_is_what_the_live_files_say(two: tuple[Engine, Engine]) -> None:
    migrated, files = two
    postjob_sa.migrate(migrated)
    _install_from_files(files)
    ours = [line for line in catalog(migrated) if VERSION_TABLE not in line]
    assert ours == catalog(files)


def _offline_sql(revision: str) -> str:
    """What ``alembic upgrade <before>:<revision> --sql`` writes for our revision alone."""
    out = io.StringIO()
    cfg = Config(str(HOST / "alembic.ini"), output_buffer=out)
    before = REVISIONS[REVISIONS.index(revision) - 1] if revision != "pj0001" else None
    command.upgrade(cfg, f"{before}:{revision}" if before else revision, sql=True)
    return out.getvalue()


def _digest(sql: str) -> str:
    # the header Alembic writes names the revision range and the date of the file, not the SQL
    lines = [line for line in sql.splitlines() if not line.startswith("-- ")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_each_revision_keeps_installing_what_it_installed() -> None:
    recorded = json.loads(DIGESTS.read_text())
    now = {rev: _digest(_offline_sql(rev)) for rev in REVISIONS}
    changed = [rev for rev in REVISIONS if recorded.get(rev) != now[rev]]
    assert not changed, (
        f"the offline SQL of {', '.join(changed)} changed: a revision is history; freeze the "
        "copy it read into postjob_sa/sql/history/ and point it there (or, for a revision not "
        f"landed yet, record the new digests in {DIGESTS.name}): {now}")


def test_a_revision_installs_its_frozen_copy_and_the_head_the_live_files() -> None:
    """The loader: a revision whose function files a later one changed reads its own frozen
    copy (history/<revision>/), the head reads the live files."""
    head = REVISIONS[-1]
    assert _sql_files.LIVE_REVISION == head
    assert _sql_files.functions(head) == _sql_files.live_functions()
    for revision in REVISIONS[:-1]:
        folder = _sql_files.HISTORY_DIR / revision
        if folder.is_dir():
            frozen = [p.read_text() for p in folder.glob("*.sql")]
            assert sorted(_sql_files.functions(revision)) == sorted(frozen)
            assert _sql_files.functions(revision) != _sql_files.live_functions()
