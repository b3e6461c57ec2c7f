"""Revision pj0007 on a live pj0006 database: jobs of several workflows checked out before the
upgrade finish under their leases, the checkout goes on across the workflows in order, and the
downgrade gives back pj0006 exactly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Connection, Engine, text

import postjob_sa
from tests.revisions import FINISH, VERSION, catalog, live_and_fresh

CHECKOUT = text(
    "SELECT id, lease_token FROM postjob.checkout_v2(NULL, 'test', ARRAY['a', 'b'], "
    "ARRAY['', ''], NULL, :limit, 60)")


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    with live_and_fresh(server_url, "pj0007") as engines:
        yield engines


def _checkout(conn: Connection, limit: int) -> list[tuple[int, int]]:
    return [(r.id, r.lease_token) for r in conn.execute(CHECKOUT, {"limit": limit})]


def test_pj0007_upgrades_a_live_pj0006_database_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0006")
    postjob_sa.migrate(fresh, "pj0006")
    pj0006 = catalog(fresh)
    with live.begin() as conn:  # work in flight: two of six jobs of two workflows running
        conn.execute(text("INSERT INTO postjob.postjobs (workflow, args, next_run_at) "
                          "SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, "
                          "jsonb_build_array(g), now() - g * interval '1 s' "
                          "FROM generate_series(1, 6) g"))
        running = _checkout(conn, 2)
        assert [i for i, _ in running] == [6, 5]
    postjob_sa.migrate(live, "pj0007")
    with live.begin() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0007"
        for job_id, token in running:  # their leases hold across the upgrade
            assert conn.execute(FINISH, {"i": job_id, "t": token}).scalar_one() == [job_id]
        taken = _checkout(conn, 3)  # the next three, earliest due first, of both workflows
        assert [i for i, _ in taken] == [4, 3, 2]
    postjob_sa.downgrade(live, "pj0006")
    assert catalog(live) == pj0006
    with live.begin() as conn:  # pj0006's checkout takes the last one
        assert [i for i, _ in _checkout(conn, 10)] == [1]
    postjob_sa.migrate(live, "pj0007")  # and up again
    with live.connect() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0007"
