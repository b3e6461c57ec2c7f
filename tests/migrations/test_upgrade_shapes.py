"""A released worker's call that waits behind a revision's ALTER TABLE must still get the
columns it expects when the ALTER commits.

pj0001's postjob.checkout and postjob.finish_and_checkout return the row type of the table
(``SETOF postjob.postjobs``, ``RETURNING j.*``); a revision that adds a column would make a call
queued behind it return one column more than its caller expects (DatatypeMismatch, and the
released worker exits). pj0002's first step, committed before anything touches the table,
spells their columns out.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from types import ModuleType

import pytest
from sqlalchemy import URL, Engine, create_engine, text

import postjob_sa
from postjob_sa._migrations import VERSIONS_DIR
from tests.conftest import drop_database

#: what a released (pj0001) worker runs each cycle (its prepared statement, spelled out)
RELEASED_CYCLE = (
    "SELECT id, lease_token, workflow, workflow_version, args, queue, root_id, full_id, parent_id "
    "FROM postjob.finish_and_checkout('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', "
    "ARRAY['w'], ARRAY[''], NULL, 1, 60, true, false)"
)


def _pj0002() -> ModuleType:
    (path,) = VERSIONS_DIR.glob("pj0002_*.py")
    spec = importlib.util.spec_from_file_location("pj0002_for_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def released_db(server_url: URL) -> Iterator[Engine]:
    url = server_url.set(database="pjt_upgrade_shapes")
    drop_database(server_url, url)
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text('CREATE DATABASE "pjt_upgrade_shapes"'))
    admin.dispose()
    engine = create_engine(url)
    postjob_sa.migrate(engine, "pj0001")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO postjob.postjobs (workflow) VALUES ('w'), ('w')"))
    yield engine
    engine.dispose()
    drop_database(server_url, url)


def _cycle_behind_an_alter(engine: Engine) -> BaseException | None:
    """A released worker (its plans cached by an earlier cycle) whose next cycle queues behind
    an uncommitted ALTER TABLE ... ADD COLUMN; the error it met once the ALTER committed."""
    result: list[BaseException | None] = []
    with engine.connect() as worker, engine.connect() as alter:
        worker.execute(text(RELEASED_CYCLE)).all()  # a cycle before the migration
        worker.commit()
        alter.execute(text("ALTER TABLE postjob.postjobs ADD COLUMN later_column bigint"))

        def cycle() -> None:
            try:
                worker.execute(text(RELEASED_CYCLE)).all()
                worker.commit()
                result.append(None)
            except Exception as exc:
                result.append(exc)

        caller = threading.Thread(target=cycle)
        caller.start()
        with engine.connect() as watch:  # until the cycle waits for the ALTER's lock
            for _ in range(500):
                if watch.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%finish_and_checkout%'")).scalar():
                    break
                threading.Event().wait(0.01)
        alter.commit()
        caller.join(10)
    return result[0]


def test_a_released_call_queued_behind_an_alter_fails_on_pj0001_shapes(released_db: Engine) -> None:
    error = _cycle_behind_an_alter(released_db)
    assert error is not None and "does not match function result type" in str(error)


def test_pj0002s_first_step_keeps_the_released_calls_columns(released_db: Engine) -> None:
    with released_db.begin() as conn:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        dbapi.cursor().execute(_pj0002().SHAPES_SQL)  # no parameters: its % stay as they are
    assert _cycle_behind_an_alter(released_db) is None
