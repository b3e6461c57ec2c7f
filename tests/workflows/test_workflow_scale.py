"""Workflows under concurrency and at scale: two workers on one tree; a 1,000-child fan-out
that finishes in a handful of parent re-runs."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue, current_job, workflow
from tests.wfutil import count_jobs, result, row

_lock = threading.Lock()
RETURNS: Counter[int] = Counter()  # job id -> how many runs returned a value
RUNS: Counter[str] = Counter()


def _returned(value: Any) -> Any:
    with _lock:
        RETURNS[current_job().id] += 1
    return value


@workflow(name="scale.leaf")
def leaf(branch: int, i: int) -> int:
    time.sleep(0.002)
    return _returned(branch * 100 + i)


@workflow(name="scale.branch")
def branch(b: int) -> list[int]:
    handles = [leaf.spawn(b, i) for i in range(4)]
    return _returned([h.result() for h in handles])  # type: ignore[no-any-return]


@workflow(name="scale.root")
def root(n: int) -> list[list[int]]:
    handles = [branch.spawn(b) for b in range(n)]
    return _returned([h.result() for h in handles])  # type: ignore[no-any-return]


def _worker(engine: Engine, root_id: int, errors: list[BaseException]) -> None:
    try:
        with Session(engine) as s:
            q = JobQueue(s, fast_mode=True)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                q.drain()
                status = s.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                                   {"i": root_id}).scalar_one()
                s.commit()
                if status in ("ok", "failed", "timeout"):
                    return
                time.sleep(0.005)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_two_workers_run_a_tree_once_each(engine: Engine, queue: JobQueue, session: Session) -> None:
    RETURNS.clear()
    root_id = queue.enqueue(root, 6).id
    session.commit()
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_worker, args=(engine, root_id, errors)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert result(session, root_id) == [[b * 100 + i for i in range(4)] for b in range(6)]
    assert count_jobs(session) == 1 + 6 + 24  # no duplicate children
    statuses = session.execute(text("SELECT status::text, count(*) FROM postjob.jobs GROUP BY 1")).all()
    assert dict(statuses) == {"ok": 31}
    ids = session.execute(text("SELECT id FROM postjob.jobs")).scalars().all()
    assert RETURNS == Counter(dict.fromkeys(ids, 1))  # every job returned exactly once
    dupes = session.execute(text(
        "SELECT count(*) FROM (SELECT parent_id, workflow, args FROM postjob.jobs "
        "WHERE parent_id IS NOT NULL GROUP BY 1, 2, 3 HAVING count(*) > 1) d")).scalar_one()
    assert dupes == 0
    session.commit()


@workflow(name="scale.item")
def item(i: int) -> int:
    return i


@workflow(name="scale.fan_out")
def fan_out(n: int) -> int:
    RUNS["fan_out"] += 1
    handles = [item.spawn(i) for i in range(n)]
    return sum(h.result() for h in handles)


def test_fan_out_of_1000_children_needs_few_parent_reruns(session: Session) -> None:
    RUNS.clear()
    queue = JobQueue(session, fast_mode=True, batch_size=50)
    parent = queue.enqueue(fan_out, 1000).id
    session.commit()
    started = time.monotonic()
    ran = queue.drain()
    took = time.monotonic() - started
    assert result(session, parent) == sum(range(1000))
    runs = RUNS["fan_out"]
    print(f"\nfan-out 1000: {runs} parent runs, {ran} job runs, {took:.2f} s")
    assert count_jobs(session) == 1001
    assert runs <= 20, runs
    assert row(session, parent)["failed_attempts"] == 0
