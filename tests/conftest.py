"""Test harness: a real PostgreSQL, a migrated template database, one clone per test module.

The server is ``POSTJOB_TEST_DATABASE_URL`` when set, else the embedded one (pgserver).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa._migrations import VERSIONS_DIR
from postjob_sa.alembic._sql_files import SQL_DIR

LOCK_KEY = 4242_0001


#: The driver every test engine and URL uses: ``POSTJOB_TEST_DRIVER=psycopg`` (psycopg 3, the
#: default, what SQLAlchemy 2.1 means by ``postgresql://``) or ``psycopg2``.
DRIVERS = ("psycopg", "psycopg2")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that take longest (worker processes, restarts, installs: tests/reliability
    and those with a test marked slow) first, in their order, then the rest: pytest-xdist
    hands whole modules out in this order, so the short ones fill the end of the run."""
    slow = {item.path for item in items
            if item.get_closest_marker("slow") or "reliability" in item.path.parts}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within stays


def driver_under_test() -> str:
    driver = os.environ.get("POSTJOB_TEST_DRIVER") or "psycopg"
    if driver not in DRIVERS:
        raise pytest.UsageError(
            f"POSTJOB_TEST_DRIVER={driver!r}: use one of {', '.join(DRIVERS)}"
        )
    return driver


def _server_url() -> URL:
    explicit = os.environ.get("POSTJOB_TEST_DATABASE_URL")
    if explicit:
        url = make_url(explicit)
    else:
        from postjob_sa import embedded

        url = make_url(embedded.database_url())
    return url.set(drivername=f"postgresql+{driver_under_test()}")


def _template_name() -> str:
    """Named by a digest of what the revisions install: their files and the SQL they read."""
    digest = hashlib.sha1()
    for path in [*sorted(VERSIONS_DIR.glob("*.py")), *sorted(SQL_DIR.rglob("*.sql"))]:
        digest.update(path.read_bytes())
    return f"postjob_tpl_{digest.hexdigest()[:12]}"


def _admin(url: URL) -> Engine:
    return create_engine(url, isolation_level="AUTOCOMMIT", poolclass=None)


@pytest.fixture(scope="session")
def server_url() -> URL:
    return _server_url()


@pytest.fixture(scope="session")
def template_db(server_url: URL) -> str:
    """A database migrated through the real revisions, created once per revision set."""
    name = _template_name()
    admin = _admin(server_url)
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
        try:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).scalar()
            if not exists:
                building = f"{name}_building"
                conn.execute(text(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{building}"'))
                tpl = create_engine(server_url.set(database=building))
                try:
                    postjob_sa.migrate(tpl)
                finally:
                    tpl.dispose()
                conn.execute(text(f'ALTER DATABASE "{building}" RENAME TO "{name}"'))
                _drop_old_templates(conn)
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
    admin.dispose()
    return name


#: Templates kept besides the newest (other checkouts of the code, on branches with SQL of
#: their own, may be testing with them at the same time).
KEPT_TEMPLATES = 16


def _drop_old_templates(conn: Connection) -> None:
    """Each revision set builds a template of its own: keep the few newest, not every one."""
    old = conn.execute(text(
        "SELECT datname FROM pg_database WHERE datname ~ '^postjob_tpl_[0-9a-f]{12}$' "
        "ORDER BY oid DESC OFFSET :keep"), {"keep": KEPT_TEMPLATES + 1}).scalars().all()
    for stale in old:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{stale}" WITH (FORCE)'))


def create_clone(server_url: URL, template: str, label: str) -> URL:
    name = f"pjt_{os.getpid()}_{re.sub(r'[^a-z0-9]', '_', label.lower())[-40:]}"
    admin = _admin(server_url)
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
        try:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
    admin.dispose()
    return server_url.set(database=name)


def drop_database(server_url: URL, url: URL) -> None:
    admin = _admin(server_url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def db_url(request: pytest.FixtureRequest, server_url: URL, template_db: str) -> Iterator[URL]:
    """A fresh database for this test module, cloned from the migrated template."""
    url = create_clone(server_url, template_db, Path(str(request.path)).stem)
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="module")
def engine(db_url: URL) -> Iterator[Engine]:
    eng = create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def clean(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE postjob.postjobs, postjob.tokens, postjob.workers, "
                          "postjob.queue_limits, postjob.schedules, postjob.events, postjob.settled_counts "
                          "RESTART IDENTITY CASCADE"))


@pytest.fixture
def session(engine: Engine, clean: None) -> Iterator[Session]:
    with Session(engine) as s:
        yield s


@pytest.fixture
def queue(session: Session) -> postjob_sa.JobQueue:
    return postjob_sa.JobQueue(session, fast_mode=True)


def url_string(url: URL) -> str:
    """The URL with its password, for subprocesses."""
    return url.render_as_string(hide_password=False)


def libpq_url(url: URL) -> str:
    """The URL as the drivers' own ``connect`` takes it (no ``+driver``), password included."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def dbapi_connect(url: URL | str) -> Any:
    """A raw connection of the driver under test, in autocommit mode (for side tables and
    statements a test runs beside postjob_sa's own connections)."""
    module: Any = importlib.import_module(driver_under_test())
    conn = module.connect(url if isinstance(url, str) else libpq_url(url))
    conn.autocommit = True
    return conn


#: Test data: make a job final by hand, as the database's own functions leave one (its status,
#: no unique key held, no row in postjob.unfinished). Tests that need a job in a state no run
#: put it in use this rather than an UPDATE of the status alone (see postjob_sa/sql/schema.sql:
#: what waits and what holds a key is not only the status column).
END_BY_HAND = text(
    "WITH ended AS (UPDATE postjob.postjobs SET status = CAST(:status AS postjob.statuses), "
    "next_run_at = NULL, unique_key_held = false WHERE id = :id RETURNING id) "
    "DELETE FROM postjob.unfinished WHERE job_id IN (SELECT id FROM ended)"
)


def end_by_hand(conn: Connection | Session, job_id: int, status: str = "failed") -> None:
    conn.execute(END_BY_HAND, {"id": job_id, "status": status})


#: Record an ok outcome ([0]) of the job under a lease token, as a worker's cycle does: true
#: when it was recorded (the run held the job), false when the database called it lost.
FINISH_OK = text(
    "SELECT NOT EXISTS (SELECT 1 FROM postjob.finish_v4(ARRAY[CAST(:id AS bigint)], "
    "ARRAY[CAST(:lease AS bigint)], ARRAY[CAST('[0]' AS jsonb)], ARRAY[''], '{}', '{}', '{}', "
    "'{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}') f WHERE f.kind = 'lost')"
)


def finish_ok(conn: Connection | Session, job_id: int, lease_token: int) -> bool:
    return bool(conn.execute(FINISH_OK, {"id": job_id, "lease": lease_token}).scalar_one())
