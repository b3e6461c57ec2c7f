"""Revision pj0009 on a live pj0008 database holding jobs in every state (waiting, due later,
keyed, limited, running, asleep on a child, a manual step, a retry, a durable sleep, a wait
for an event, one cancelled while its run goes on), limits and a schedule: what waits and
runs is carried into postjob.unfinished, the running jobs keep their leases, pj0008's calls
keep working on the new schema (its workers and apps are served), this code runs everything
to its end, and the downgrade gives back pj0008 exactly, with what is left consistent for
pj0008's code. The calls pj0008's code makes while the revision runs are the upgrade
window's test (tests/reliability/test_upgrade_window.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Connection, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry
from tests.revisions import VERSION, catalog, live_and_fresh

reg = Registry()


@postjob_sa.workflow(name="m9.work", registry=reg)
def work(x: int) -> int:
    return x


@postjob_sa.workflow(name="m9.parent", registry=reg)
def parent() -> list[Any]:
    return [work.spawn(1).result(), postjob_sa.manual("approve").result()]


@postjob_sa.workflow(name="m9.napper", registry=reg)
def napper() -> str:
    postjob_sa.sleep(3600)
    return "rested"


@postjob_sa.workflow(name="m9.waiter", registry=reg)
def waiter() -> Any:
    return postjob_sa.wait_for_event("m9-key")


#: pj0008's checkout (through the API: the caller's lease) and its outcomes, as that release's
#: code calls them.
CHECKOUT_V3 = text(
    "SELECT id, lease_token FROM postjob.checkout_v3(NULL, 'old', ARRAY[:w], ARRAY[''], "
    "CAST(:queues AS text[]), :limit, 600, true)")
FINISH_V3 = text(
    "SELECT kind, id FROM postjob.finish_jobs_v3(CAST(:ok_ids AS bigint[]), "
    "CAST(:ok_tokens AS bigint[]), CAST(:ok_results AS jsonb[]), CAST(:ok_versions AS text[]), "
    "CAST(:outcomes AS jsonb), '{}')")


def _finish_v3(conn: Connection, job_id: int, token: int, kind: str, **kw: Any) -> list[Any]:
    if kind == "ok":
        params = {"ok_ids": [job_id], "ok_tokens": [token], "ok_results": ["[0]"],
                  "ok_versions": [""], "outcomes": "[]"}
    else:
        element = [job_id, token, kind, None, kw.get("error"), kw.get("error"), None, "",
                   kw.get("awaiting"), kw.get("retry_in"), kw.get("wake_in")]
        params = {"ok_ids": [], "ok_tokens": [], "ok_results": [], "ok_versions": [],
                  "outcomes": json.dumps([element])}
    return [tuple(r) for r in conn.execute(FINISH_V3, params)]


@pytest.fixture
def scratch(server_url: URL, template_db: str) -> Iterator[tuple[Engine, Engine]]:
    with live_and_fresh(server_url, "pj0009") as engines:
        yield engines


def _one(conn: Connection, sql: str, **params: Any) -> Any:
    return conn.execute(text(sql), params).scalar()


def _fill_pj0008(conn: Connection) -> dict[str, Any]:
    """Jobs in every state, as pj0008's code leaves them."""
    ins = ("INSERT INTO postjob.postjobs (workflow, args, queue, priority, unique_key, "
           "next_run_at, status) VALUES (:w, CAST(:a AS jsonb), :q, :p, :k, "
           "now() + make_interval(secs => :due), CAST(:s AS postjob.statuses)) RETURNING id")
    job: dict[str, Any] = {}

    def add(name: str, **kw: Any) -> int:
        values = {"w": "m9.work", "a": "[1]", "q": "q", "p": 0, "k": None, "due": -60.0,
                  "s": "ready", **kw}
        job[name] = conn.execute(text(ins), values).scalar_one()
        return int(job[name])

    add("due", a="[10]")
    add("urgent", a="[11]", p=5)
    add("later", a="[12]", due=3600.0)
    add("keyed", a="[13]", k="the-key")
    add("limited", a="[14]", q="lim")
    add("capped", a="[15]", q="lim")
    for status in ("ok", "failed", "timeout", "cancelled"):
        add(status, s=status, a="[0]")
    conn.execute(text("INSERT INTO postjob.queue_limits (queue, concurrency, rate, period) "
                      "VALUES ('lim', 1, 100, 60)"))
    conn.execute(text("INSERT INTO postjob.schedules (name, every, next_tick_at) "
                      "VALUES ('m9.work', 3600, now() + interval '1 hour')"))
    # running: checked out by pj0008's checkout (a lease token each)
    job["running"], job["running_token"] = conn.execute(
        CHECKOUT_V3, {"w": "m9.work", "queues": ["lim"], "limit": 1}).one()
    assert job["running"] == job["limited"]
    # one checked out and then cancelled while its run goes on (its lease row stays)
    add("gone", a="[17]", q="g")
    gone, job["gone_token"] = conn.execute(
        CHECKOUT_V3, {"w": "m9.work", "queues": ["g"], "limit": 1}).one()
    assert gone == job["gone"]
    conn.execute(text("SELECT postjob.cancel_jobs(ARRAY[CAST(:g AS bigint)])"), {"g": gone})
    # a parent asleep on a child that is due, and a manual step waiting for its token
    p = add("parent", w="m9.parent", a="[]", q="tree")
    _, parent_token = conn.execute(
        CHECKOUT_V3, {"w": "m9.parent", "queues": ["tree"], "limit": 1}).one()
    job["child"] = conn.execute(text(
        "INSERT INTO postjob.postjobs (workflow, args, parent_id, queue) "
        "VALUES ('m9.work', '[1]', :p, 'tree') RETURNING id"), {"p": p}).scalar_one()
    job["manual"] = conn.execute(text(
        "INSERT INTO postjob.postjobs (workflow, args, parent_id) "
        "VALUES ('__manual__', '[\"approve\"]', :p) RETURNING id"), {"p": p}).scalar_one()
    assert _finish_v3(conn, p, parent_token, "sleep", awaiting=job["child"]) == []
    job["token"] = _one(conn, "SELECT postjob.manual_token(:m)::text", m=job["manual"])
    # a retry scheduled by pj0008's outcome of an error (a minute away)
    add("retry", a="[16]", q="r")
    _, retry_token = conn.execute(CHECKOUT_V3, {"w": "m9.work", "queues": ["r"], "limit": 1}).one()
    assert _finish_v3(conn, job["retry"], retry_token, "err", error="E", retry_in=60) == []
    # a durable sleep (its step stored, its sleep an hour long) and a wait for an event
    for name, workflow in (("napper", "m9.napper"), ("waiter", "m9.waiter")):
        add(name, w=workflow, a="[]", q="d" + name)
        _, token = conn.execute(
            CHECKOUT_V3, {"w": workflow, "queues": ["d" + name], "limit": 1}).one()
        if name == "napper":
            conn.execute(text("SELECT postjob.record_step_v1(:j, :t, 'sleep', '1', NULL, NULL, "
                              "NULL, NULL, 3600, NULL)"), {"j": job[name], "t": token})
            assert _finish_v3(conn, job[name], token, "sleep", wake_in=3600) == []
        else:
            state = _one(conn, "SELECT state FROM postjob.wait_event_v1(:j, :t, 1, 'm9-key', "
                               "NULL)", j=job[name], t=token)
            assert state == "wait"
            assert _finish_v3(conn, job[name], token, "sleep") == []
    return job


UNFINISHED = text(
    "SELECT job_id, status::text, due, lease_token IS NOT NULL, unique_key "
    "FROM postjob.unfinished")


def test_pj0009_carries_live_pj0008_data_over_serves_its_code_and_downgrades_exactly(
    scratch: tuple[Engine, Engine],
) -> None:
    live, fresh = scratch
    postjob_sa.migrate(live, "pj0008")
    postjob_sa.migrate(fresh, "pj0008")
    pj0008 = catalog(fresh)
    with live.begin() as conn:
        job = _fill_pj0008(conn)

    postjob_sa.migrate(live, "pj0009")
    with live.begin() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0009"
        rows = {r[0]: tuple(r[1:]) for r in conn.execute(UNFINISHED)}
        assert rows == {
            job["due"]: ("ready", True, False, None),
            job["urgent"]: ("ready", True, False, None),
            job["later"]: ("ready", False, False, None),
            job["keyed"]: ("ready", True, False, "the-key"),
            job["limited"]: ("ready", True, True, None),  # running, under its lease
            job["capped"]: ("ready", True, False, None),
            job["gone"]: ("cancelled", True, True, None),  # its run goes on
            job["parent"]: ("sleep", False, False, None),
            job["child"]: ("ready", True, False, None),
            job["manual"]: ("ready", False, False, None),
            job["retry"]: ("err", False, False, None),
            job["napper"]: ("sleep", False, False, None),
            job["waiter"]: ("sleep", False, False, None),
        }
        assert _one(conn, "SELECT count(*) FROM postjob.waiting") == 0  # kept, empty
        assert _one(conn, "SELECT count(*) FROM postjob.leases") == 0
        assert _one(conn, "SELECT count(*) FROM postjob.postjobs WHERE lease_token IS NOT NULL "
                          "OR status = 'processing'") == 0
        assert _one(conn, "SELECT status::text FROM postjob.jobs WHERE id = :r",
                    r=job["running"]) == "processing"
        assert _one(conn, "SELECT count(*) FROM postjob.queue_slots "
                          "WHERE queue = 'lim' AND job_id = :r", r=job["running"]) == 1
        # the key is still held: a second job with it is refused
        assert conn.execute(text("SELECT count(*) FROM postjob.unfinished "
                                 "WHERE unique_key = 'the-key'")).scalar() == 1
        # reset waits for the run of the job cancelled while it ran
        assert _one(conn, "SELECT postjob._run_may_be_executing(:g)", g=job["gone"]) is True
    with live.begin() as conn:  # pj0008's calls go on: its checkout takes the highest first
        assert conn.execute(CHECKOUT_V3, {"w": "m9.work", "queues": None, "limit": 1}
                            ).one()[0] == job["urgent"]
        conn.rollback()
    with live.begin() as conn:  # its running jobs finish under their leases
        assert _finish_v3(conn, job["running"], job["running_token"], "ok") == []
        assert _finish_v3(conn, job["gone"], job["gone_token"], "ok") == [("lost", job["gone"])]
    with live.connect() as conn:  # the cancelled job's run is over: its row goes
        assert _one(conn, "SELECT count(*) FROM postjob.unfinished WHERE job_id = :g",
                    g=job["gone"]) == 0

    postjob_sa.migrate(live)  # on to head, where this code runs what is left to its end
    with Session(live) as s:
        q = JobQueue(s, registry=reg, fast_mode=True)
        for name in ("later", "retry", "napper"):
            q.force(job[name])
        s.commit()
        q.drain()
        q.resolve(job["token"], "yes")
        q.emit_event("m9-key", "came")
        s.commit()
        q.drain()
        q.drain()
    with live.connect() as conn:
        left = dict(conn.execute(text(
            "SELECT id, status::text FROM postjob.jobs WHERE status NOT IN "
            "('ok', 'failed', 'timeout', 'cancelled')")).all())
        assert left == {}, left
        assert _one(conn, "SELECT results FROM postjob.postjobs WHERE id = :p",
                    p=job["parent"]) == [[1, "yes"]]
        assert _one(conn, "SELECT results FROM postjob.postjobs WHERE id = :w",
                    w=job["waiter"]) == ["came"]
        assert _one(conn, "SELECT results FROM postjob.postjobs WHERE id = :n",
                    n=job["napper"]) == ["rested"]
        assert _one(conn, "SELECT count(*) FROM postjob.unfinished") == 0

    # back down with work in flight again: a running job and a due one
    with Session(live) as s:
        q = JobQueue(s, registry=reg)
        due, other = q.enqueue(work, 20).id, q.enqueue(work, 21).id
        s.commit()
        [held] = q.checkout(["m9.work"])
        token = held.lease_token
        assert held.id == due
        s.commit()
    postjob_sa.downgrade(live, "pj0008")
    assert catalog(live) == pj0008
    with live.begin() as conn:  # pj0008's code goes on: the lease holds, the due job is taken
        assert _one(conn, "SELECT status::text FROM postjob.postjobs WHERE id = :d",
                    d=due) == "processing"
        assert _finish_v3(conn, due, token, "ok") == []
        assert conn.execute(CHECKOUT_V3, {"w": "m9.work", "queues": None, "limit": 5}
                            ).one()[0] == other
    postjob_sa.migrate(live, "pj0009")  # and up again
    with live.connect() as conn:
        assert conn.execute(VERSION).scalar_one() == "pj0009"
    postjob_sa.migrate(live)
