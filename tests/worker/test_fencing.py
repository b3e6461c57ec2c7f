"""A run that lost its lease writes nothing more: no children, no progress note, no outcome.

The scene of the review: a parent times out with its tree while its child is still running; the
child's run then tries to spawn a grandchild (which another worker would run) or to note its
progress. Both are refused, the run is abandoned, and the log says so.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry

pytestmark = pytest.mark.both_drivers

reg = Registry()
go_on = threading.Event()
child_started = threading.Event()


@postjob_sa.workflow(name="fence.parent", registry=reg)
def parent(action: str) -> str:
    return str(child.spawn(action).result())


@postjob_sa.workflow(name="fence.child", registry=reg)
def child(action: str) -> str:
    child_started.set()
    assert go_on.wait(20)
    if action == "spawn":
        grandchild.spawn(1).result()
    else:
        postjob_sa.set_workflow_status("late news")
    return "done"


@postjob_sa.workflow(name="fence.grandchild", registry=reg)
def grandchild(x: int) -> int:
    return x


def _rows(engine: Engine) -> dict[str, tuple[str, str | None]]:
    with engine.connect() as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(text(
            "SELECT workflow, status::text, workflow_status FROM postjob.jobs"))}


@pytest.mark.parametrize("action", ["spawn", "status"])
def test_a_child_timed_out_with_its_tree_writes_nothing_more(
    engine: Engine, clean: None, action: str, caplog: pytest.LogCaptureFixture
) -> None:
    go_on.clear()
    child_started.clear()
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True, registry=reg)
        q.enqueue(parent, action, timeout=1.0)
        s.commit()
    ran: list[int] = []

    def drain() -> None:
        with Session(engine) as s:
            ran.append(JobQueue(s, fast_mode=True, registry=reg).drain())

    worker = threading.Thread(target=drain)
    with caplog.at_level(logging.WARNING, logger="postjob_sa.worker"):
        worker.start()
        try:
            assert child_started.wait(10)  # the parent sleeps, its child runs
            time.sleep(1.1)  # past the parent's deadline
            with Session(engine) as s:
                assert JobQueue(s).reap() >= 1  # the parent times out, with its tree
                s.commit()
            assert _rows(engine)["fence.child"][0] == "timeout"
        finally:
            go_on.set()
            worker.join(20)
    assert not worker.is_alive()
    rows = _rows(engine)
    assert "fence.grandchild" not in rows  # no orphan work
    assert rows["fence.child"] == ("timeout", None)  # no late note either
    assert rows["fence.parent"][0] == "timeout"
    assert "lease lost during the run" in caplog.text
