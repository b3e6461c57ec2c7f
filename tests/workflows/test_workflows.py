"""Restartable workflows end to end on a real server: context, fan-out/fan-in, trees,
idempotent spawn, failure propagation, manual steps and tokens."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import (
    ChildFailed,
    InvalidArgument,
    InvalidJobState,
    JobNotFound,
    JobQueue,
    NonRecoverable,
    NotInJob,
    current_job,
    manual,
    set_workflow_status,
    workflow,
)
from tests.wfutil import children, count_jobs, result, row

pytestmark = pytest.mark.both_drivers

RUNS: Counter[str] = Counter()


@workflow(name="wf.double")
def double(x: int) -> int:
    return x * 2


@workflow(name="wf.echo")
def echo(value: Any) -> Any:
    return value


@workflow(name="wf.who")
def who() -> dict[str, Any]:
    job = current_job()
    set_workflow_status("halfway there")
    return {"id": job.id, "workflow": job.workflow, "args": job.args,
            "root_id": job.root_id, "full_id": job.full_id, "parent_id": job.parent_id}


@workflow(name="wf.fan")
def fan(n: int) -> list[int]:
    handles = [double.spawn(i) for i in range(n)]
    return [h.result() for h in handles]


@workflow(name="wf.tree")
def tree(depth: int) -> list[dict[str, Any]]:
    me = current_job()
    mine = {"id": me.id, "full_id": me.full_id, "root_id": me.root_id, "parent_id": me.parent_id}
    if depth == 0:
        return [mine]
    below: list[dict[str, Any]] = tree.spawn(depth - 1).result()
    return [mine, *below]


@workflow(name="wf.rerun")
def rerun() -> dict[str, Any]:
    RUNS["rerun"] += 1
    ids = [double.spawn(i).id for i in range(3)]
    # The same dict args with the keys in another order, alternating between runs.
    first = {"a": 1, "b": [1, 2], "c": {"y": 2, "x": 1}}
    second = {"c": {"x": 1, "y": 2}, "b": [1, 2], "a": 1}
    one, two = (first, second) if RUNS["rerun"] % 2 else (second, first)
    d1, d2 = echo.spawn(one), echo.spawn(two)
    assert d1.id == d2.id
    gate = manual("gate")
    assert gate.token  # minted on the first run, the same one on every re-run
    opened = gate.result()
    return {"children": ids, "dict_child": d1.id, "gate": opened}


@workflow(name="wf.boom")
def boom(why: str) -> None:
    raise NonRecoverable(f"kaput: {why}")


@workflow(name="wf.parent_of_boom")
def parent_of_boom() -> Any:
    return boom.spawn("deep").result()


@workflow(name="wf.grandparent_of_boom")
def grandparent_of_boom() -> Any:
    return parent_of_boom.spawn().result()


@workflow(name="wf.catcher")
def catcher() -> dict[str, Any]:
    try:
        return boom.spawn("caught").result()  # type: ignore[no-any-return]
    except ChildFailed as exc:
        return {"caught": exc.status, "child": exc.child_id, "error": exc.error}


@workflow(name="wf.waits_for_manual")
def waits_for_manual(label: str, timeout: float | None) -> Any:
    step = manual(label, timeout=timeout)
    set_workflow_status(f"token {step.token}")
    return {"got": step.result()}


@workflow(name="wf.manual_and_failing_sibling")
def manual_and_failing_sibling() -> Any:
    gate = manual("never-resolved")
    boom.spawn("sibling")
    return gate.result()


def _run(queue: JobQueue, session: Session, wf: Any, *args: Any, **opts: Any) -> int:
    job_id = queue.enqueue(wf, *args, **opts).id
    session.commit()
    queue.drain()
    return job_id


# -- the job context ---------------------------------------------------------------------------


def test_context_helpers_outside_a_job_raise_not_in_job() -> None:
    with pytest.raises(NotInJob, match="only inside a workflow"):
        current_job()
    with pytest.raises(NotInJob):
        set_workflow_status("nope")
    with pytest.raises(NotInJob):
        double.spawn(1)
    with pytest.raises(NotInJob):
        manual("nope")
    with pytest.raises(NotInJob):
        postjob_sa.current_session()


def test_current_job_inside_and_workflow_status_in_the_row(queue: JobQueue, session: Session) -> None:
    job_id = _run(queue, session, who)
    seen = result(session, job_id)
    assert seen == {"id": job_id, "workflow": "wf.who", "args": [], "root_id": job_id,
                    "full_id": str(job_id), "parent_id": None}
    assert row(session, job_id)["workflow_status"] == "halfway there"
    with pytest.raises(NotInJob):  # the context does not leak out of the run
        current_job()


# -- fan-out / fan-in, trees, idempotent spawn ---------------------------------------------------


def test_fan_out_fan_in_gathers_results_in_order(queue: JobQueue, session: Session) -> None:
    job_id = _run(queue, session, fan, 20)
    assert result(session, job_id) == [2 * i for i in range(20)]
    kids = children(session, job_id)
    assert len(kids) == 20
    assert sorted(k["args"][0] for k in kids) == list(range(20))
    assert {k["status"] for k in kids} == {"ok"}


def test_three_level_tree_has_full_and_root_ids_at_every_level(queue: JobQueue, session: Session) -> None:
    a = _run(queue, session, tree, 2)
    levels = result(session, a)
    assert len(levels) == 3
    ids = [lv["id"] for lv in levels]
    assert [lv["full_id"] for lv in levels] == [
        f"{ids[0]}", f"{ids[0]}.{ids[1]}", f"{ids[0]}.{ids[1]}.{ids[2]}"
    ]
    assert {lv["root_id"] for lv in levels} == {a}
    assert [lv["parent_id"] for lv in levels] == [None, ids[0], ids[1]]
    for lv in levels:  # the rows agree with what the jobs saw
        r = row(session, lv["id"])
        assert (r["full_id"], r["root_id"], r["status"]) == (lv["full_id"], a, "ok")


def test_children_are_created_once_across_ten_reruns(queue: JobQueue, session: Session) -> None:
    RUNS.clear()
    parent = _run(queue, session, rerun)
    assert row(session, parent)["status"] == "sleep"
    for _ in range(10):  # forced re-runs: each finds every child again and sleeps again
        queue.force(parent)
        session.commit()
        queue.drain()
        assert row(session, parent)["status"] == "sleep"
    assert RUNS["rerun"] >= 11
    kids = children(session, parent)
    assert len(kids) == 5  # three doubles, one echo (dict args), one manual gate
    assert count_jobs(session) == 6
    gate = next(k for k in kids if k["workflow"] == "__manual__")
    token = session.execute(
        text("SELECT token FROM postjob.tokens WHERE postjob_id = :id"), {"id": gate["id"]}
    ).scalar_one()
    queue.resolve(token, "open")
    session.commit()
    queue.drain()
    out = result(session, parent)
    assert out["gate"] == "open"
    assert sorted(out["children"]) == sorted(k["id"] for k in kids if k["workflow"] == "wf.double")
    assert count_jobs(session) == 6


# -- failure and timeout propagation ---------------------------------------------------------------


def test_failed_child_fails_the_parent_at_once_with_child_failed(queue: JobQueue, session: Session) -> None:
    parent = _run(queue, session, parent_of_boom)
    p = row(session, parent)
    assert p["status"] == "failed"
    assert p["failed_attempts"] == 1  # non-recoverable: no retries against the same child
    assert p["error"] == "postjob_sa.errors.ChildFailed"
    (kid,) = children(session, parent)
    assert kid["status"] == "failed"
    assert f"child job {kid['id']} failed" in p["error_message"]
    assert "kaput: deep" in p["error_message"]


def test_failure_propagates_up_a_tree(queue: JobQueue, session: Session) -> None:
    top = _run(queue, session, grandparent_of_boom)
    t = row(session, top)
    assert (t["status"], t["error"]) == ("failed", "postjob_sa.errors.ChildFailed")
    assert "ChildFailed" in t["error_message"]  # the middle job's error, carried up


def test_parent_can_catch_child_failed_and_succeed(queue: JobQueue, session: Session) -> None:
    parent = _run(queue, session, catcher)
    out = result(session, parent)
    (kid,) = children(session, parent)
    assert out == {"caught": "failed", "child": kid["id"], "error": "postjob_sa.errors.NonRecoverable"}


def test_timed_out_child_fails_its_parent(queue: JobQueue, session: Session) -> None:
    parent = _run(queue, session, waits_for_manual, "slow", 0.2)
    assert row(session, parent)["status"] == "sleep"
    time.sleep(0.3)
    session.commit()  # reap() judges deadlines by now(): the start of its transaction
    assert queue.reap() == 1
    session.commit()
    assert row(session, parent)["status"] == "ready"  # woken by the child's timeout
    queue.drain()
    p = row(session, parent)
    assert p["status"] == "failed"
    assert p["error"] == "postjob_sa.errors.ChildFailed"
    assert "timeout" in p["error_message"]


def test_a_failing_sibling_wakes_the_parent_which_sleeps_on_until_its_own_wait_ends(
    queue: JobQueue, session: Session
) -> None:
    """The parent waits on a manual step; its other child fails: the failure wakes the parent
    (it re-runs), which sleeps again on the step it waits for; resolving the step ends it."""
    parent = _run(queue, session, manual_and_failing_sibling)
    p = row(session, parent)
    assert p["status"] == "sleep", p
    kids = {k["workflow"]: k for k in children(session, parent)}
    assert kids["wf.boom"]["status"] == "failed"
    assert p["awaiting_id"] == kids["__manual__"]["id"]
    token = session.execute(
        text("SELECT postjob.manual_token(:i)"), {"i": kids["__manual__"]["id"]}
    ).scalar_one()
    queue.resolve(token, "open")
    session.commit()
    queue.drain()
    p = row(session, parent)
    assert p["status"] == "ok" and p["results"] == ["open"]


# -- manual steps and tokens ------------------------------------------------------------------------


def _token_of(session: Session, parent: int) -> str:
    status = row(session, parent)["workflow_status"]
    assert status.startswith("token ")
    return str(status.removeprefix("token "))


def test_manual_step_resolved_by_token_wakes_the_parent(queue: JobQueue, session: Session) -> None:
    parent = _run(queue, session, waits_for_manual, "approve", None)
    assert row(session, parent)["status"] == "sleep"
    token = _token_of(session, parent)
    (step,) = children(session, parent)
    assert step["workflow"] == "__manual__" and step["args"] == ["approve"]
    assert queue.resolve(token, {"approved_by": "ann"}) == step["id"]
    session.commit()
    assert row(session, parent)["status"] == "ready"
    queue.drain()
    assert result(session, parent) == {"got": {"approved_by": "ann"}}
    assert _token_of(session, parent) == token  # the token is minted once, found on re-runs


def test_manual_step_resolved_with_error_fails_the_parent(queue: JobQueue, session: Session) -> None:
    parent = _run(queue, session, waits_for_manual, "reject", None)
    token = _token_of(session, parent)
    queue.resolve(token, error="rejected by bob")
    session.commit()
    queue.drain()
    p = row(session, parent)
    assert p["status"] == "failed"
    assert p["error"] == "postjob_sa.errors.ChildFailed"
    assert "rejected by bob" in p["error_message"]


def test_resolve_rejects_bad_tokens_and_leaves_the_session_usable(queue: JobQueue, session: Session) -> None:
    parent = _run(queue, session, waits_for_manual, "once", None)
    token = _token_of(session, parent)
    with pytest.raises(InvalidArgument):
        queue.resolve("not-a-uuid", 1)
    with pytest.raises(JobNotFound):
        queue.resolve("00000000-0000-4000-8000-000000000000", 1)
    # A token pointing at a job that is not a manual step.
    other = queue.enqueue(double, 1).id
    session.execute(
        text("INSERT INTO postjob.tokens (postjob_id, token) "
             "VALUES (:id, '11111111-1111-4111-8111-111111111111')"),
        {"id": other},
    )
    session.commit()
    with pytest.raises(InvalidJobState, match="not a manual job"):
        queue.resolve("11111111-1111-4111-8111-111111111111", 1)
    queue.resolve(token, "first")
    session.commit()
    with pytest.raises(InvalidJobState, match="already ok"):
        queue.resolve(token, "second")
    # The session is still usable and the first resolution stands.
    assert session.execute(text("SELECT 1")).scalar_one() == 1
    session.commit()
    queue.drain()
    assert result(session, parent) == {"got": "first"}


def test_a_resolve_that_loses_the_race_is_refused_and_leaves_the_session_usable(
        queue: JobQueue, session: Session) -> None:
    """Two resolves of one token at once: the one whose look came before the other committed
    waits for it in the database, then is refused as InvalidJobState (not a database error
    that would end the caller's transaction)."""
    parent = _run(queue, session, waits_for_manual, "race", None)
    token = _token_of(session, parent)
    session.commit()
    engine = session.get_bind()
    first = Session(engine)
    JobQueue(first).resolve(token, "first")  # holds the job until it commits
    outcome: list[BaseException | int] = []
    second = Session(engine)

    def resolve_second() -> None:
        try:
            outcome.append(JobQueue(second).resolve(token, "second"))
        except BaseException as exc:
            outcome.append(exc)

    racer = threading.Thread(target=resolve_second)
    racer.start()
    deadline = time.monotonic() + 10
    while not _waits_for_a_lock(session) and time.monotonic() < deadline:
        time.sleep(0.02)
    first.commit()
    first.close()
    racer.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], InvalidJobState), outcome
    assert "already ok" in str(outcome[0])
    assert second.execute(text("SELECT 1")).scalar_one() == 1  # still usable
    second.rollback()
    second.close()
    queue.drain()
    assert result(session, parent) == {"got": "first"}


def _waits_for_a_lock(session: Session) -> bool:
    found = session.execute(text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'")).scalar_one()
    session.rollback()
    return bool(found)


def test_token_of_a_normal_child_is_refused(queue: JobQueue, session: Session) -> None:
    @workflow(name="wf.asks_token_of_normal_child")
    def asks() -> str:
        return double.spawn(5).token

    parent = _run(queue, session, asks)
    p = row(session, parent)
    assert p["status"] in ("err", "failed")
    assert "not a manual job" in p["error_message"]
