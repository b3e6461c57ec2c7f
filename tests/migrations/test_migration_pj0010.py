"""Revision pj0010 on a live pj0009 database: the record becomes the first range of the
partitioned table without a rewrite (every row stays where it was, in postjobs_from_0), a
host's foreign key to the record is moved to the partitioned table and validated, a job's
children and tokens still go with it, this code runs what was left to its end; the downgrade
merges the ranges back into one table and gives back pj0009 exactly, the host's key on it.
(pj0009's workers running during the upgrade: tests/reliability/test_rolling_upgrade.py; the
calls queued behind its steps: tests/reliability/test_upgrade_window.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Connection, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import Job, JobQueue, Registry
from postjob_sa._migrations import head_revision
from tests.revisions import VERSION, catalog, live_and_fresh

reg = Registry()


@postjob_sa.workflow(name="m10.work", registry=reg)
def work(x: int) -> int:
    return x


HOST_KEY = text(
    "SELECT c.confrelid::regclass::text, c.convalidated FROM pg_constraint c "
    "WHERE c.conname = 'orders_job_id_fkey' AND c.conparentid = 0")
WHERE = text("SELECT tableoid::regclass::text, count(*) FROM postjob.postjobs GROUP BY 1")


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    with live_and_fresh(server_url, "pj0010") as engines:
        yield engines


def _one(conn: Connection, sql: str, **params: Any) -> Any:
    return conn.execute(text(sql), params).scalar()


def _fill(conn: Connection) -> dict[str, int]:
    job: dict[str, int] = {}
    ins = ("INSERT INTO postjob.postjobs (workflow, args, status, parent_id) "
           "VALUES ('m10.work', CAST(:a AS jsonb), CAST(:s AS postjob.statuses), :p) RETURNING id")
    for name, status in (("due", "ready"), ("ok", "ok"), ("failed", "failed")):
        job[name] = conn.execute(text(ins), {"a": "[1]", "s": status, "p": None}).scalar_one()
    job["parent"] = conn.execute(text(ins), {"a": "[2]", "s": "ok", "p": None}).scalar_one()
    job["child"] = conn.execute(text(ins), {"a": "[3]", "s": "ok",
                                            "p": job["parent"]}).scalar_one()
    job["grandchild"] = conn.execute(text(
        "INSERT INTO postjob.postjobs (workflow, args, parent_id) "
        "VALUES ('__manual__', '[]', :p) RETURNING id"), {"p": job["child"]}).scalar_one()
    _one(conn, "SELECT postjob.manual_token(:m)", m=job["grandchild"])
    conn.execute(text("CREATE TABLE orders (id bigint PRIMARY KEY, job_id bigint "
                      "REFERENCES postjob.postjobs (id) ON DELETE CASCADE)"))
    conn.execute(text("INSERT INTO orders VALUES (1, :d), (2, :p)"),
                 {"d": job["due"], "p": job["parent"]})
    return job


def test_pj0010_attaches_the_record_as_its_first_range_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0009")
    postjob_sa.migrate(fresh, "pj0009")
    pj0009 = catalog(fresh)
    with live.begin() as conn:
        job = _fill(conn)
        before = _one(conn, "SELECT md5(string_agg(id || ':' || status || ':' || args::text, ',' "
                            "ORDER BY id)) FROM postjob.postjobs")
        relfile = _one(conn, "SELECT pg_relation_filenode('postjob.postjobs')")

    postjob_sa.migrate(live)
    with live.begin() as conn:
        assert conn.execute(VERSION).scalar_one() == head_revision()  # pj0010 or later
        assert _one(conn, "SELECT relkind FROM pg_class "
                          "WHERE oid = 'postjob.postjobs'::regclass") == "p"
        # not rewritten: the same file, every row where it was
        assert _one(conn, "SELECT pg_relation_filenode('postjob.postjobs_from_0')") == relfile
        assert [tuple(r) for r in conn.execute(WHERE)] == [("postjob.postjobs_from_0", 6)]
        assert _one(conn, "SELECT md5(string_agg(id || ':' || status || ':' || args::text, ',' "
                          "ORDER BY id)) FROM postjob.postjobs") == before
        assert tuple(conn.execute(HOST_KEY).one()) == ("postjob.postjobs", True)
        assert _one(conn, "SELECT pg_get_serial_sequence('postjob.postjobs', 'id')") == (
            "postjob.postjobs_id_seq")
    with Session(live) as s:  # this code on it
        q = JobQueue(s, registry=reg, fast_mode=True)
        new = q.enqueue(work, 5).id
        s.commit()
        assert q.drain() == 2
        assert s.get(Job, new) is not None and s.get(Job, job["due"]) is not None
        # a tree goes whole with its root (its token too), and the host's rows by its key
        s.execute(text("DELETE FROM postjob.postjobs WHERE id = :p"), {"p": job["parent"]})
        s.commit()
        left = s.execute(text("SELECT id FROM postjob.postjobs ORDER BY id")).scalars().all()
        assert left == [job["due"], job["ok"], job["failed"], new]
        assert s.execute(text("SELECT count(*) FROM postjob.tokens")).scalar() == 0
        assert s.execute(text("SELECT job_id FROM orders")).scalars().all() == [job["due"]]
        with pytest.raises(Exception, match="orders_job_id_fkey"):
            s.execute(text("INSERT INTO orders VALUES (3, 999999)"))
        s.rollback()

    postjob_sa.downgrade(live, "pj0009")
    assert catalog(live) == pj0009
    with live.begin() as conn:
        assert tuple(conn.execute(HOST_KEY).one()) == ("postjob.postjobs", True)
        assert _one(conn, "SELECT relkind FROM pg_class "
                          "WHERE oid = 'postjob.postjobs'::regclass") == "r"
        assert _one(conn, "SELECT count(*) FROM postjob.postjobs") == 4
    postjob_sa.migrate(live)  # and up again
    with live.connect() as conn:
        assert conn.execute(VERSION).scalar_one() == head_revision()  # pj0010 or later
