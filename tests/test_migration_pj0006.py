"""Revision pj0006 on a live pj0005 database: jobs checked out before the upgrade finish under
their leases, the checkout goes on (in one statement for one pair's backlog), and the
downgrade gives back pj0005 exactly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Connection, Engine, create_engine, text

import postjob_sa
from tests.conftest import create_clone, drop_database
from tests.test_migration_pj0004 import CATALOG

CHECKOUT = text(
    "SELECT id, lease_token FROM postjob.checkout_v2(NULL, 'test', ARRAY['w'], ARRAY[''], "
    "NULL, :limit, 60)")
FINISH = text(
    "SELECT postjob.finish_jobs(ARRAY[:i]::bigint[], ARRAY[:t]::bigint[], ARRAY['ok'], "
    "ARRAY['[1]'::jsonb], ARRAY[NULL], ARRAY[NULL], ARRAY[NULL::jsonb], ARRAY[''], "
    "ARRAY[NULL::bigint])")
VERSION = text("SELECT postjob.schema_version()")


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    urls = [create_clone(server_url, "template0", f"pj0006_{n}") for n in ("live", "fresh")]
    engines = [create_engine(u) for u in urls]
    yield engines[0], engines[1]
    for eng, url in zip(engines, urls, strict=True):
        eng.dispose()
        drop_database(server_url, url)


def _catalog(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(CATALOG)]


def _checkout(conn: Connection, limit: int) -> list[tuple[int, int]]:
    return [(r.id, r.lease_token) for r in conn.execute(CHECKOUT, {"limit": limit})]


def test_pj0006_upgrades_a_live_pj0005_database_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0005")
    postjob_sa.migrate(fresh, "pj0005")
    pj0005 = _catalog(fresh)
    with live.begin() as conn:  # work in flight: two of five jobs running
        conn.execute(text("INSERT INTO postjob.postjobs (workflow, args, next_run_at) "
                          "SELECT 'w', jsonb_build_array(g), now() - g * interval '1 s' "
                          "FROM generate_series(1, 5) g"))
        running = _checkout(conn, 2)
    postjob_sa.migrate(live, "pj0006")
    with live.begin() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0006"
        for job_id, token in running:  # their leases hold across the upgrade
            assert conn.execute(FINISH, {"i": job_id, "t": token}).scalar_one() == [job_id]
        taken = _checkout(conn, 2)  # the next two, earliest due first
        assert [i for i, _ in taken] == [3, 2]
    postjob_sa.downgrade(live, "pj0005")
    assert _catalog(live) == pj0005
    with live.begin() as conn:  # pj0005's checkout takes the last one
        assert [i for i, _ in _checkout(conn, 10)] == [1]
    postjob_sa.migrate(live, "pj0006")  # and up again
    with live.connect() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0006"
