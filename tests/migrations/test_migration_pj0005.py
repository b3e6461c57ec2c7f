"""Revision pj0005 on a live pj0004 database: the jobs in flight go on, a concurrency limit
counts the jobs that were running before the upgrade, and the downgrade gives back pj0004
exactly (every function, index, column and constraint)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Connection, Engine, text

import postjob_sa
from tests.revisions import FINISH, VERSION, catalog, live_and_fresh

CHECKOUT = text(
    "SELECT id, lease_token, queue FROM postjob.checkout_v2(NULL, 'test', ARRAY['w'], "
    "ARRAY[''], NULL, :limit, 60)")


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    with live_and_fresh(server_url, "pj0005") as engines:
        yield engines


def _checkout(conn: Connection, limit: int) -> list[tuple[int, int, str]]:
    return [(r.id, r.lease_token, r.queue) for r in conn.execute(CHECKOUT, {"limit": limit})]


def test_pj0005_upgrades_a_live_pj0004_database_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0004")
    postjob_sa.migrate(fresh, "pj0004")
    pj0004 = catalog(fresh)
    with live.begin() as conn:  # work in flight: two jobs of a queue limited to 2 running
        conn.execute(text("INSERT INTO postjob.queue_limits (queue, concurrency) "
                          "VALUES ('lim', 2)"))
        conn.execute(text("INSERT INTO postjob.postjobs (workflow, args, queue) "
                          "SELECT 'w', jsonb_build_array(g), 'lim' FROM generate_series(1, 5) g"))
        running = _checkout(conn, 5)
        assert [q for _, _, q in running] == ["lim", "lim"]
        conn.execute(text("INSERT INTO postjob.postjobs (workflow, args, queue) "
                          "SELECT 'w', jsonb_build_array(g), 'free' FROM generate_series(1, 3) g"))
    postjob_sa.migrate(live, "pj0005")
    with live.begin() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0005"
        # the limit still counts the two running since before: only the free jobs come
        assert sorted(q for _, _, q in _checkout(conn, 10)) == ["free"] * 3
    with live.begin() as conn:
        job_id, token, _ = running[0]
        assert conn.execute(FINISH, {"i": job_id, "t": token}).scalar_one() == [job_id]
    with live.begin() as conn:
        assert [q for _, _, q in _checkout(conn, 10)] == ["lim"]  # one place free
    postjob_sa.downgrade(live, "pj0004")
    assert catalog(live) == pj0004
    with live.begin() as conn:  # pj0004's checkout counts through its index again
        assert _checkout(conn, 10) == []
    postjob_sa.migrate(live, "pj0005")  # and up again
    with live.connect() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0005"
