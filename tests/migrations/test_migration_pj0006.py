"""Revision pj0006 on a live pj0005 database: jobs checked out before the upgrade finish under
their leases, the checkout goes on (in one statement for one pair's backlog), and the
downgrade gives back pj0005 exactly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Connection, Engine, text

import postjob_sa
from tests.revisions import FINISH, VERSION, catalog, live_and_fresh

CHECKOUT = text(
    "SELECT id, lease_token FROM postjob.checkout_v2(NULL, 'test', ARRAY['w'], ARRAY[''], "
    "NULL, :limit, 60)")


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    with live_and_fresh(server_url, "pj0006") as engines:
        yield engines


def _checkout(conn: Connection, limit: int) -> list[tuple[int, int]]:
    return [(r.id, r.lease_token) for r in conn.execute(CHECKOUT, {"limit": limit})]


def test_pj0006_upgrades_a_live_pj0005_database_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0005")
    postjob_sa.migrate(fresh, "pj0005")
    pj0005 = catalog(fresh)
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
    assert catalog(live) == pj0005
    with live.begin() as conn:  # pj0005's checkout takes the last one
        assert [i for i, _ in _checkout(conn, 10)] == [1]
    postjob_sa.migrate(live, "pj0006")  # and up again
    with live.connect() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0006"
