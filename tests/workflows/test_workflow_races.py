"""Wake-up races, ordered deterministically: two connections call postjob.checkout_v4 and
postjob.finish_v4 directly, one holding its transaction open so that the other must wait
on a row lock; we check that the waiter really is blocked before letting the first commit.
Also: wake-ups without waste, cascading timeouts with fencing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from postjob_sa import JobQueue, workflow
from postjob_sa._db import Conn as DbConn
from tests.wfutil import children, row

pytestmark = pytest.mark.both_drivers

#: One outcome (ok through the ok arrays, the others through the other ones); the ids
#: recorded (the one sent, unless the database called it lost).
FINISH = (
    "SELECT ARRAY(SELECT %(id)s::bigint EXCEPT SELECT f.id FROM postjob.finish_v4("
    "CASE WHEN %(outcome)s = 'ok' THEN ARRAY[%(id)s]::bigint[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s = 'ok' THEN ARRAY[%(lease)s]::bigint[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s = 'ok' THEN ARRAY[%(result)s]::jsonb[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s = 'ok' THEN ARRAY['']::text[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[%(id)s]::bigint[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[%(lease)s]::bigint[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[%(outcome)s]::text[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[%(error)s]::text[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[%(message)s]::text[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[NULL]::jsonb[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY['']::text[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[%(awaiting)s]::bigint[] ELSE '{}' END, "
    "CASE WHEN %(outcome)s <> 'ok' THEN ARRAY[0.01]::float8[] ELSE '{}' END, "
    "'{}', '{}') f WHERE f.kind = 'lost')"
)


class Conn:
    """A raw connection (of the driver under test) to the test database (autocommit unless begun)."""

    def __init__(self, engine: Engine):
        self.raw = DbConn.open(engine).raw
        self.pid = self.one("SELECT pg_backend_pid()")

    def one(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        with self.raw.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0] if cur.description else None

    def begin(self) -> None:
        self.raw.autocommit = False

    def commit(self) -> None:
        self.raw.commit()
        self.raw.autocommit = True

    def job(self, workflow: str, parent_id: int | None = None) -> int:
        return int(self.one(
            "INSERT INTO postjob.postjobs (workflow, parent_id) VALUES (%(w)s, %(p)s) RETURNING id",
            {"w": workflow, "p": parent_id},
        ))

    def checkout(self, workflow: str) -> tuple[int, int]:
        with self.raw.cursor() as cur:
            cur.execute(
                "SELECT id, lease_token FROM postjob.checkout_v4(NULL, 'test', ARRAY[%(w)s], "
                "ARRAY[''], NULL, 1, 60, true, false, false)",
                {"w": workflow},
            )
            got = cur.fetchone()
        assert got is not None, f"nothing to check out for {workflow}"
        return int(got[0]), int(got[1])

    def finish(self, job: tuple[int, int], outcome: str, *, awaiting: int | None = None,
               result: str | None = None, error: str | None = None) -> list[int]:
        return list(self.one(FINISH, {
            "id": job[0], "lease": job[1], "outcome": outcome, "awaiting": awaiting,
            "result": result, "error": error, "message": error,
        }))

    def status(self, job_id: int) -> str:
        return str(self.one("SELECT status::text FROM postjob.jobs WHERE id = %(i)s", {"i": job_id}))

    def close(self) -> None:
        self.raw.close()


@pytest.fixture
def conns(engine: Engine, clean: None) -> Iterator[tuple[Conn, Conn, Conn]]:
    made = (Conn(engine), Conn(engine), Conn(engine))
    yield made
    for c in made:
        c.close()


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def wait_until_blocked(observer: Conn, pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if observer.one("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %(p)s", {"p": pid}) == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never blocked on a lock")


def _parent_with_children(c: Conn, *names: str) -> tuple[tuple[int, int], list[int]]:
    parent = c.job("race.parent")
    kids = [c.job(n, parent) for n in names]
    return c.checkout("race.parent"), kids


# -- the lost wake-up --------------------------------------------------------------------------


def test_child_finishing_between_read_and_sleep_commits_first(conns: tuple[Conn, Conn, Conn]) -> None:
    """The parent read the child unfinished; the child's completion commits before the parent
    records 'sleep': the parent must come out ready."""
    cp, cc, _ = conns
    parent, (kid,) = _parent_with_children(cp, "race.a")
    child = cc.checkout("race.a")
    assert cp.status(kid) == "processing"  # the parent's read: unfinished
    assert cc.finish(child, "ok", result="[1]") == [kid]  # parent is processing: no wake-up
    assert cp.status(parent[0]) == "processing"
    assert cp.finish(parent, "sleep", awaiting=kid) == [parent[0]]
    assert cp.status(parent[0]) == "ready"


def test_child_completion_in_flight_while_parent_goes_to_sleep(conns: tuple[Conn, Conn, Conn]) -> None:
    """The child's completion is written but not committed when the parent records 'sleep':
    the parent's finish waits for it (FOR SHARE on the awaited child) and ends ready."""
    cp, cc, watch = conns
    parent, (kid,) = _parent_with_children(cp, "race.a")
    child = cc.checkout("race.a")
    cc.begin()
    assert cc.finish(child, "ok", result="[1]") == [kid]  # saw the parent processing
    t, out = in_thread(lambda: cp.finish(parent, "sleep", awaiting=kid))
    wait_until_blocked(watch, cp.pid)
    cc.commit()
    t.join(10)
    assert out == [[parent[0]]]
    assert watch.status(parent[0]) == "ready"
    assert watch.status(kid) == "ok"


def test_parent_sleep_in_flight_while_child_completes(conns: tuple[Conn, Conn, Conn]) -> None:
    """Reverse order: the parent's 'sleep' is written but not committed when the child
    finishes. The child's outcome does not wait for the parent's row (an outcome never waits
    for another job): it leaves its end to be told (postjob.wakeups), the parent's sleep
    commits, and the next idle wait or promotion of any worker wakes the parent; an idle
    worker looks again within a second while an end is still to be told."""
    cp, cc, watch = conns
    parent, (kid,) = _parent_with_children(cp, "race.a")
    child = cc.checkout("race.a")
    cp.begin()
    assert cp.finish(parent, "sleep", awaiting=kid) == [parent[0]]
    assert cc.finish(child, "ok", result="[1]") == [kid]  # did not wait
    cp.commit()
    assert watch.status(kid) == "ok"
    assert watch.status(parent[0]) == "sleep"
    assert watch.one("SELECT array_agg(job_id) FROM postjob.wakeups") == [kid]
    idle = ("SELECT postjob.worker_idle_v2(NULL, ARRAY['race.other'], ARRAY[''], NULL, "
            "false)")
    cp.begin()  # another transaction holds the parent's row: the end stays to be told
    cp.one("SELECT 1 FROM postjob.unfinished WHERE job_id = %(i)s FOR UPDATE", {"i": parent[0]})
    wait = watch.one(idle)
    assert wait is not None and 0 < wait <= 1
    assert watch.status(parent[0]) == "sleep"
    cp.commit()
    watch.one(idle)
    assert watch.status(parent[0]) == "ready"
    assert watch.one("SELECT count(*) FROM postjob.wakeups") == 0


@pytest.mark.parametrize("in_flight", [False, True], ids=["committed", "in-flight"])
def test_sibling_failing_while_parent_runs_does_not_leave_it_asleep(
    conns: tuple[Conn, Conn, Conn], in_flight: bool
) -> None:
    """The parent waits on A; its other child B fails while the parent is still processing.
    The failure must not be lost: the parent's 'sleep' on A becomes ready."""
    cp, cc, watch = conns
    parent, (a, b) = _parent_with_children(cp, "race.a", "race.b")
    child_b = cc.checkout("race.b")
    if not in_flight:
        assert cc.finish(child_b, "failed", error="Boom") == [b]
        assert cp.finish(parent, "sleep", awaiting=a) == [parent[0]]
    else:
        cc.begin()
        assert cc.finish(child_b, "failed", error="Boom") == [b]
        t, out = in_thread(lambda: cp.finish(parent, "sleep", awaiting=a))
        wait_until_blocked(watch, cp.pid)
        cc.commit()
        t.join(10)
        assert out == [[parent[0]]]
    assert watch.status(parent[0]) == "ready"
    assert watch.status(a) == "ready"  # a sibling's failure cancels only its own descendants


def test_ok_sibling_while_parent_runs_does_not_wake_it(conns: tuple[Conn, Conn, Conn]) -> None:
    cp, cc, _ = conns
    parent, (a, b) = _parent_with_children(cp, "race.a", "race.b")
    assert cc.finish(cc.checkout("race.b"), "ok", result="[2]") == [b]
    assert cp.finish(parent, "sleep", awaiting=a) == [parent[0]]
    assert cp.status(parent[0]) == "sleep"


# -- wake-ups without waste ---------------------------------------------------------------------


def test_parent_is_woken_only_by_the_awaited_child_finishing(conns: tuple[Conn, Conn, Conn]) -> None:
    cp, cc, _ = conns
    parent, (a, b) = _parent_with_children(cp, "race.a", "race.b")
    assert cp.finish(parent, "sleep", awaiting=a) == [parent[0]]
    assert cp.status(parent[0]) == "sleep"
    cc.finish(cc.checkout("race.b"), "ok", result='"b"')  # an unrelated child: no wake-up
    assert cp.status(parent[0]) == "sleep"
    cc.finish(cc.checkout("race.a"), "err", error="Flaky")  # a retriable error: no wake-up
    assert (cp.status(a), cp.status(parent[0])) == ("err", "sleep")
    time.sleep(0.05)  # fast-mode back-off
    cc.finish(cc.checkout("race.a"), "ok", result='"a"')
    assert cp.status(parent[0]) == "ready"


# -- cascading timeouts and fencing ---------------------------------------------------------------


@workflow(name="races.mid")
def mid() -> Any:
    from postjob_sa import manual

    return manual("deep").result()


@workflow(name="races.leaf")
def leaf() -> str:
    return "late"


@workflow(name="races.top", timeout=1.0)
def top() -> Any:
    m, lf = mid.spawn(), leaf.spawn()
    return [m.result(), lf.result()]


def test_timeout_cascades_to_descendants_and_fences_late_results(
    engine: Engine, queue: JobQueue, session: Session, conns: tuple[Conn, Conn, Conn]
) -> None:
    root = queue.enqueue(top).id
    session.commit()
    assert queue.work(count=1, workflows=["races.top"]) == 1  # top spawns mid and leaf, sleeps
    assert queue.work(count=1, workflows=["races.mid"]) == 1  # mid spawns a manual step, sleeps
    worker = conns[0]
    leaf_run = worker.checkout("races.leaf")  # a worker is running the leaf right now
    kids = {k["workflow"]: k["id"] for k in children(session, root)}
    (deep,) = children(session, kids["races.mid"])
    assert [row(session, i)["status"] for i in (root, kids["races.mid"], deep["id"], leaf_run[0])] == [
        "sleep", "sleep", "ready", "processing"]
    time.sleep(1.05)  # past top's deadline
    session.commit()
    assert queue.reap() >= 1
    session.commit()
    statuses = {i: row(session, i) for i in (root, kids["races.mid"], deep["id"], leaf_run[0])}
    assert {i: r["status"] for i, r in statuses.items()} == dict.fromkeys(statuses, "timeout")
    assert statuses[root]["error_message"] == "timeout"
    assert f"job {root} ended with status timeout" in statuses[leaf_run[0]]["error_message"]
    # The leaf's worker finishes late: its write is fenced off.
    assert worker.finish(leaf_run, "ok", result='"late"') == []
    assert row(session, leaf_run[0])["status"] == "timeout"
    assert row(session, leaf_run[0])["results"] is None
