"""Revision pj0004 on a live pj0003 database: the jobs in flight go on, the new features work,
and the downgrade gives back pj0003 exactly (every function, index, column, constraint and
enum label), cancelled jobs turned into failed ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Engine, text

import postjob_sa
from tests.revisions import catalog, live_and_fresh


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    with live_and_fresh(server_url, "pj0004") as engines:
        yield engines


def _status(conn: object, job_id: int) -> str:
    return str(conn.execute(text("SELECT status::text FROM postjob.postjobs WHERE id = :i"),  # type: ignore[attr-defined]
                            {"i": job_id}).scalar_one())


def test_pj0004_upgrades_a_live_pj0003_database_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0003")
    postjob_sa.migrate(fresh, "pj0003")
    pj0003 = catalog(fresh)
    with live.begin() as conn:  # work in flight: due jobs, a running one, a sleeping parent
        conn.execute(text("INSERT INTO postjob.postjobs (workflow, args) "
                          "SELECT 'w', jsonb_build_array(g) FROM generate_series(1, 5) g"))
        running = conn.execute(text(
            "SELECT id, lease_token FROM postjob.checkout_v2(NULL, 'old', ARRAY['w'], ARRAY[''], "
            "NULL, 1, 60)")).one()
        parent = conn.execute(text("INSERT INTO postjob.postjobs (workflow, status, next_run_at) "
                                   "VALUES ('p', 'sleep', NULL) RETURNING id")).scalar_one()
        child = conn.execute(text("INSERT INTO postjob.postjobs (workflow, parent_id) "
                                  "VALUES ('__manual__', :p) RETURNING id"), {"p": parent}
                             ).scalar_one()
    postjob_sa.migrate(live, "pj0004")
    with live.begin() as conn:
        # the running job's outcome is still accepted under its lease
        accepted = conn.execute(text(
            "SELECT postjob.finish_jobs(ARRAY[:i]::bigint[], ARRAY[:t]::bigint[], ARRAY['ok'], "
            "ARRAY['[1]'::jsonb], ARRAY[NULL], ARRAY[NULL], ARRAY[NULL::jsonb], ARRAY[''], "
            "ARRAY[NULL::bigint])"), {"i": running.id, "t": running.lease_token}).scalar_one()
        assert accepted == [running.id]
        conn.execute(text("UPDATE postjob.postjobs SET priority = 9 WHERE args = '[5]'"))
        first = conn.execute(text(
            "SELECT args FROM postjob.checkout_v2(NULL, 'new', ARRAY['w'], ARRAY[''], NULL, 1, 60)"
        )).scalar_one()
        assert first == [5]  # the highest priority first
    # pj0004's own interface (this code speaks to a newer schema): cancel, and a unique key
    with live.begin() as conn:
        assert conn.execute(text("SELECT postjob.cancel_jobs(ARRAY[:c]::bigint[])"),
                            {"c": child}).scalar_one() == [child]
        keyed = text("INSERT INTO postjob.postjobs (workflow, unique_key) VALUES ('w', 'k') "
                     "ON CONFLICT DO NOTHING RETURNING id")
        assert conn.execute(keyed).scalar() is not None
        assert conn.execute(keyed).scalar() is None  # held: the second one is not inserted
    with live.connect() as conn:
        assert _status(conn, parent) == "ready"  # woken by its cancelled child
    postjob_sa.downgrade(live, "pj0003")
    with live.connect() as conn:
        assert _status(conn, child) == "failed"
        assert conn.execute(text("SELECT error FROM postjob.postjobs WHERE id = :i"),
                            {"i": child}).scalar_one() == "Cancelled"
    assert catalog(live) == pj0003
    postjob_sa.migrate(live, "pj0004")  # and up again
    with live.connect() as conn:
        assert conn.execute(text("SELECT postjob.schema_version()")).scalar_one() == "pj0004"
