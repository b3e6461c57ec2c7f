"""The checkout hands out exactly the jobs a plain query over the whole table would: the eligible
ones (served pairs and queues, due, not timing out, allowed by the queue limits), highest
priority first, then earliest due, then oldest. Checked on many random tables small enough to
cover every shape the checkout treats apart: one group (one statement) or several (their first
jobs merged), several queues at the highest priority, a group with nothing due, served and
unserved queues, limited queues, several workflows and pinned versions; tables where one
(workflow, version) pair holds every job, planned as usual and with nested loops off (its
batch comes in checkout order whatever the join); and tables where each pair's jobs form one
group, at priorities of their own."""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.pool import NullPool

WORKFLOWS = ("co.a", "co.b", "co.c")

INSERT = text(
    "INSERT INTO postjob.postjobs (workflow, workflow_version, queue, priority, status, "
    "next_run_at, timing_out_at, failed_attempts) "
    "VALUES (:workflow, :version, :queue, :priority, CAST(:status AS postjob.statuses), "
    "now() + make_interval(secs => :due), "
    "CASE WHEN :timing_out THEN now() - interval '1 minute' END, "
    "CASE WHEN :status = 'err' THEN 1 ELSE 0 END) RETURNING id"
)

#: What the checkout must hand out, by its definition.
EXPECTED = text(
    "SELECT j.id FROM postjob.jobs j "
    "WHERE j.status IN ('ready', 'err') AND j.next_run_at <= now() "
    "AND (j.timing_out_at IS NULL OR j.timing_out_at > now()) "
    "AND EXISTS (SELECT 1 FROM unnest(CAST(:workflows AS text[]), CAST(:versions AS text[])) "
    "            AS w(name, version) "
    "            WHERE w.name = j.workflow AND j.workflow_version IN ('', w.version)) "
    "AND (CAST(:queues AS text[]) IS NULL OR j.queue = ANY (CAST(:queues AS text[]))) "
    "AND j.queue NOT IN (SELECT l.queue FROM postjob.queue_limits l WHERE l.concurrency = 0) "
    "ORDER BY j.priority DESC, j.next_run_at, j.id LIMIT :limit"
)

#: A worker's checkout (it makes due first what has come due).
CHECKOUT = text(
    "SELECT id FROM postjob.checkout_v4(NULL, NULL, CAST(:workflows AS text[]), "
    "CAST(:versions AS text[]), CAST(:queues AS text[]), :limit, 60, false, false, true)"
)


def _scenario(
    rng: random.Random, one_pair: bool = False, one_group: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, int]]:
    levels = rng.choice([[0], [0], [0, 1], [0, 5, -1], [2, 7]])
    queues = rng.choice([["default"], ["default"], ["a", "b"], ["a", "b", "c"]])
    jobs = []
    for _ in range(rng.randint(0, 14)):
        jobs.append({
            "workflow": rng.choice(WORKFLOWS),
            "version": rng.choice(["", "", "", "v1", "v2"]),
            "queue": rng.choice(queues),
            "priority": rng.choice(levels),
            "status": rng.choice(["ready", "ready", "ready", "err"]),
            # whole minutes apart in the past, or an hour ahead: never at the boundary
            "due": rng.choice([-60.0 * rng.randint(1, 30)] * 4 + [3600.0]),
            "timing_out": rng.random() < 0.05,
        })
    served = rng.sample(WORKFLOWS[:2], rng.randint(1, 2))
    call = {
        "workflows": served,
        "versions": [rng.choice(["", "v1"]) for _ in served],
        "queues": rng.choice([None, None, None, [rng.choice(queues)]]),
        "limit": rng.choice([1, 1, 2, 3, 10]),
    }
    # limits that let everything through (the limited path must give the same jobs) or
    # nothing (the queue is left out)
    limits = {q: rng.choice([1000, 0]) for q in queues if rng.random() < 0.2}
    if one_pair:  # every job of one served pair
        for job in jobs:
            job["workflow"], job["version"] = served[0], ""
    if one_group:  # each pair's jobs in one (priority, queue) group of its own choosing
        groups: dict[tuple[str, str], tuple[int, str]] = {}
        for job in jobs:
            job["priority"], job["queue"] = groups.setdefault(
                (job["workflow"], job["version"]), (rng.choice(levels), rng.choice(queues)))
    return jobs, call, limits


def _check(
    conn: Connection, rng: random.Random, one_pair: bool = False, one_group: bool = False
) -> tuple[list[int], list[int], Any]:
    jobs, call, limits = _scenario(rng, one_pair, one_group)
    for job in jobs:
        conn.execute(INSERT, job)
    for queue, concurrency in limits.items():
        conn.execute(text("INSERT INTO postjob.queue_limits (queue, concurrency) VALUES (:q, :c)"),
                     {"q": queue, "c": concurrency})
    expected = [r[0] for r in conn.execute(EXPECTED, call)]
    got = [r[0] for r in conn.execute(CHECKOUT, call)]
    return expected, got, (jobs, call, limits)


@pytest.mark.parametrize(
    ("seed", "tables", "one_pair", "one_group"),
    [
        (20261201, 400, False, False),  # anything
        (20261202, 300, True, False),  # one pair holds every job: pj0006's one statement
        (20261204, 300, False, True),  # each pair alone at its priority: pj0007's read
    ],
    ids=["any", "one_pair", "one_group_each"],
)
def test_checkout_gives_what_the_definition_gives_on_random_tables(
    engine: Engine, seed: int, tables: int, one_pair: bool, one_group: bool,
) -> None:
    rng = random.Random(seed)
    for n in range(tables):
        with engine.connect() as conn:
            try:
                expected, got, case = _check(conn, rng, one_pair, one_group)
            finally:
                conn.rollback()
        assert got == expected, (n, case)


def test_a_batch_comes_in_checkout_order_whatever_the_join(engine: Engine) -> None:
    rng = random.Random(20261203)
    fresh = create_engine(engine.url, poolclass=NullPool)  # a session that plans anew
    try:
        with fresh.connect() as conn:
            conn.execute(text("SET enable_nestloop = off"))
            for n in range(200):
                try:
                    expected, got, case = _check(conn, rng, one_pair=True)
                finally:
                    conn.rollback()
                assert got == expected, (n, case)
    finally:
        fresh.dispose()
