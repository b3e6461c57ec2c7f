"""Revision pj0008 on a live pj0007 database holding jobs in every state, limits and a
schedule: what waits, runs and holds a key is carried into the new tables, the pj0007
release's calls keep working on the new schema (its workers are served: oldest_served_code is
pj0007), this code runs everything to its end (durable steps, sleeps and events too), and the
downgrade gives back pj0007 exactly (the durable tables and the trace context go), with what is
left consistent for pj0007's code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Connection, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry
from tests.revisions import FINISH, VERSION, catalog, live_and_fresh

reg = Registry()


@postjob_sa.workflow(name="m8.work", registry=reg)
def work(x: int) -> int:
    return x


@postjob_sa.workflow(name="m8.parent", registry=reg)
def parent() -> list[Any]:
    return [work.spawn(1).result(), postjob_sa.manual("approve").result()]


@postjob_sa.workflow(name="m8.durable", registry=reg)
def durable(key: str) -> list[Any]:
    """pj0008's durable steps, sleeps and events, on a database upgraded from pj0007."""
    charged = postjob_sa.step("charge", lambda: 42)
    postjob_sa.sleep(0)
    return [charged, postjob_sa.wait_for_event(key)]


#: pj0007's checkout and cycle, as that release's code calls them.
CHECKOUT_V2 = text(
    "SELECT id, lease_token FROM postjob.checkout_v2(NULL, 'old', ARRAY['m8.work'], ARRAY[''], "
    "CAST(:queues AS text[]), :limit, 60)")
OLD_CYCLE = text(
    "SELECT kind, id, status, lease_token FROM postjob.worker_cycle(NULL, 'old', "
    "ARRAY[:i]::bigint[], ARRAY[:t]::bigint[], ARRAY['err'], ARRAY[NULL::jsonb], ARRAY['E'], "
    "ARRAY['boom'], ARRAY[NULL::jsonb], ARRAY[''], ARRAY[NULL::bigint], ARRAY['m8.work'], "
    "ARRAY[''], NULL, 0, 60, false, false)")


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    with live_and_fresh(server_url, "pj0008") as engines:
        yield engines


def _one(conn: Connection, sql: str, **params: Any) -> Any:
    return conn.execute(text(sql), params).scalar()


def _fill_pj0007(conn: Connection) -> dict[str, Any]:
    """Jobs in every state, as pj0007's code leaves them."""
    ins = ("INSERT INTO postjob.postjobs (workflow, args, queue, priority, unique_key, "
           "next_run_at, status) VALUES (:w, CAST(:a AS jsonb), :q, :p, :k, "
           "now() + make_interval(secs => :due), CAST(:s AS postjob.statuses)) RETURNING id")
    job: dict[str, Any] = {}

    def add(name: str, **kw: Any) -> None:
        values = {"w": "m8.work", "a": "[1]", "q": "q", "p": 0, "k": None, "due": -60.0,
                  "s": "ready", **kw}
        job[name] = conn.execute(text(ins), values).scalar_one()

    add("due", a="[10]")
    add("urgent", a="[11]", p=5)
    add("later", a="[12]", due=3600.0)
    add("keyed", a="[13]", k="the-key")
    add("limited", a="[14]", q="lim")
    add("capped", a="[15]", q="lim")
    for name, status in (("ok", "ok"), ("failed", "failed"), ("timeout", "timeout"),
                         ("cancelled", "cancelled")):
        add(name, s=status, a="[0]")
    conn.execute(text("INSERT INTO postjob.queue_limits (queue, concurrency, rate, period) "
                      "VALUES ('lim', 1, 100, 60)"))
    conn.execute(text("INSERT INTO postjob.schedules (name, every, next_tick_at) "
                      "VALUES ('m8.work', 3600, now() + interval '1 hour')"))
    # running: checked out by pj0007's checkout (a lease token each)
    job["running"], job["running_token"] = conn.execute(
        CHECKOUT_V2, {"queues": ["lim"], "limit": 1}).one()
    assert job["running"] == job["limited"]
    # a parent asleep on a child that is due, and a manual step waiting for its token
    p = job["parent"] = conn.execute(text(
        "INSERT INTO postjob.postjobs (workflow, status, next_run_at) "
        "VALUES ('m8.parent', 'sleep', NULL) RETURNING id")).scalar_one()
    job["child"] = conn.execute(text(
        "INSERT INTO postjob.postjobs (workflow, args, parent_id) VALUES ('m8.work', '[1]', :p) "
        "RETURNING id"), {"p": p}).scalar_one()
    job["manual"] = conn.execute(text(
        "INSERT INTO postjob.postjobs (workflow, args, parent_id) "
        "VALUES ('__manual__', '[\"approve\"]', :p) RETURNING id"), {"p": p}).scalar_one()
    conn.execute(text("UPDATE postjob.postjobs SET awaiting_id = :c WHERE id = :p"),
                 {"c": job["child"], "p": p})
    job["token"] = _one(conn, "SELECT postjob.manual_token(:m)::text", m=job["manual"])
    # a retry scheduled by pj0007's own outcome of an error
    job["retry"] = conn.execute(text(
        "INSERT INTO postjob.postjobs (workflow, args, queue) VALUES ('m8.work', '[16]', 'r') "
        "RETURNING id")).scalar_one()
    retry_token = conn.execute(CHECKOUT_V2, {"queues": ["r"], "limit": 1}).one()[1]
    rows = conn.execute(OLD_CYCLE, {"i": job["retry"], "t": retry_token}).all()
    assert [(r.kind, r.status) for r in rows] == [("done", "err")]
    return job


def test_pj0008_carries_live_pj0007_data_over_serves_its_code_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0007")
    postjob_sa.migrate(fresh, "pj0007")
    pj0007 = catalog(fresh)
    with live.begin() as conn:
        job = _fill_pj0007(conn)

    postjob_sa.migrate(live, "pj0008")
    with live.begin() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0008"
        waiting = {r[0]: (r[1], r[2]) for r in conn.execute(text(
            "SELECT job_id, status::text, due FROM postjob.waiting"))}
        assert waiting == {
            job["due"]: ("ready", True), job["urgent"]: ("ready", True),
            job["later"]: ("ready", False), job["keyed"]: ("ready", True),
            job["capped"]: ("ready", True), job["parent"]: ("sleep", False),
            job["child"]: ("ready", True), job["manual"]: ("ready", False),
            job["retry"]: ("err", False),
        }
        leases = conn.execute(text("SELECT token, job_ids FROM postjob.leases")).all()
        assert [tuple(r) for r in leases] == [(job["running_token"], [job["running"]])]
        assert _one(conn, "SELECT count(*) FROM postjob.queue_slots "
                          "WHERE queue = 'lim' AND job_id = :r", r=job["running"]) == 1
        assert _one(conn, "SELECT unique_key_held FROM postjob.postjobs WHERE id = :k",
                    k=job["keyed"]) is True
        # the key is still held: a second job with it is not inserted
        assert conn.execute(text(
            "INSERT INTO postjob.postjobs (workflow, unique_key) VALUES ('m8.work', 'the-key') "
            "ON CONFLICT DO NOTHING RETURNING id")).scalar() is None
    with live.connect() as conn:  # pj0007's checkout takes the highest priority first
        assert conn.execute(CHECKOUT_V2, {"queues": None, "limit": 1}).one()[0] == job["urgent"]
        conn.rollback()
    with live.begin() as conn:  # and the job it was running finishes under its lease
        assert conn.execute(FINISH, {"i": job["running"], "t": job["running_token"]}
                            ).scalar_one() == [job["running"]]

    postjob_sa.migrate(live)  # on to head, where this code runs what is left to its end
    with Session(live) as s:
        q = JobQueue(s, registry=reg, fast_mode=True)
        q.force(job["later"])
        q.force(job["retry"])
        s.commit()
        q.drain()
        q.resolve(job["token"], "yes")
        s.commit()
        q.drain()
        q.drain()
    with live.connect() as conn:
        left = dict(conn.execute(text(
            "SELECT id, status::text FROM postjob.postjobs WHERE status NOT IN "
            "('ok', 'failed', 'timeout', 'cancelled')")).all())
        assert left == {}, left
        assert _one(conn, "SELECT results FROM postjob.postjobs WHERE id = :p",
                    p=job["parent"]) == [[1, "yes"]]
        assert _one(conn, "SELECT count(*) FROM postjob.waiting") == 0
        assert _one(conn, "SELECT count(*) FROM postjob.leases") == 0

    with Session(live) as s:  # durable workflows work on the upgraded database
        q = JobQueue(s, registry=reg, fast_mode=True)
        durable_id = q.enqueue(durable, "m8-key").id
        s.commit()
        q.drain()
        assert _one(s.connection(), "SELECT status::text FROM postjob.postjobs WHERE id = :d",
                    d=durable_id) == "sleep"
        q.emit_event("m8-key", "shipped")
        s.commit()
        q.drain()
        assert _one(s.connection(), "SELECT results FROM postjob.postjobs WHERE id = :d",
                    d=durable_id) == [[42, "shipped"]]
        assert _one(s.connection(), "SELECT count(*) FROM postjob.steps WHERE job_id = :d",
                    d=durable_id) == 3
        s.commit()

    # back down with work in flight again (from head): a running job and a due one
    with Session(live) as s:
        q = JobQueue(s, registry=reg)
        due, running = q.enqueue(work, 20).id, q.enqueue(work, 21).id
        s.commit()
        [held] = q.checkout(["m8.work"])
        token = held.lease_token
        assert held.id == due
        s.commit()
    postjob_sa.downgrade(live, "pj0007")
    assert catalog(live) == pj0007
    with live.begin() as conn:  # pj0007's code goes on: the lease holds, the due job is taken
        assert conn.execute(FINISH, {"i": due, "t": token}).scalar_one() == [due]
        assert conn.execute(CHECKOUT_V2, {"queues": None, "limit": 5}).one()[0] == running
    postjob_sa.migrate(live, "pj0008")  # and up again
    with live.connect() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0008"
    postjob_sa.migrate(live)
    with Session(live) as s:  # with empty durable tables, in use at once (at head)
        q = JobQueue(s, registry=reg, fast_mode=True)
        q.emit_event("m8-again", "back")
        again = q.enqueue(durable, "m8-again").id
        s.commit()
        q.drain()
        assert _one(s.connection(), "SELECT results FROM postjob.postjobs WHERE id = :d",
                    d=again) == [[42, "back"]]
