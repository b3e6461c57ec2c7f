"""The upgrade window (tests/reliability/upgrade_window.py) for every revision since the
release the head serves: the released worker's checkout and outcomes, queued behind each step
that installs function bodies, neither run a job twice nor lose one, and the released worker
goes on (a call that failed did so with an error it tries again).

Every storage revision is held to it: migrating from the release the head serves to head runs
the window at each such step of each revision on the way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry
from tests.conftest import create_clone, drop_database
from tests.reliability.upgrade_window import PJ0008, Release, WindowJobs, run_window

pytestmark = [pytest.mark.slow, pytest.mark.both_drivers]

#: The release whose workers run while the schema goes to head (the oldest the head serves).
SERVED = PJ0008
#: Steps that install function bodies, at most, on the way to head (workflows for each).
MAX_WINDOWS = 6

reg = Registry()
ran: list[tuple[str, int]] = []


def _workflows(step: int) -> None:
    @postjob_sa.workflow(name=f"win.child.{step}", registry=reg)
    def child() -> str:
        ran.append(("child", postjob_sa.current_job().id))
        return "child"

    def record(kind: str) -> Any:
        def run() -> str:
            ran.append((kind, postjob_sa.current_job().id))
            return kind
        return run

    for kind in ("taken", "spare", "retried"):
        postjob_sa.workflow(name=f"win.{kind}.{step}", registry=reg)(record(kind))

    @postjob_sa.workflow(name=f"win.parent.{step}", registry=reg)
    def parent() -> str:
        ran.append(("parent", postjob_sa.current_job().id))
        return str(child.spawn().result())


for _step in range(1, MAX_WINDOWS + 1):
    _workflows(_step)


@pytest.fixture
def released_db(server_url: URL, template_db: str) -> Iterator[URL]:
    """A database at the revision of the release the head serves (its revisions installed it:
    they are history, so this code's copy installs what the release's did)."""
    url = create_clone(server_url, "template0", "upgrade_window")
    engine = create_engine(url)
    try:
        postjob_sa.migrate(engine, SERVED.revision)
    finally:
        engine.dispose()
    yield url
    drop_database(server_url, url)


UNFINISHED = text(
    "SELECT id, workflow, status::text FROM postjob.postjobs "
    "WHERE status NOT IN ('ok', 'failed', 'timeout', 'cancelled') ORDER BY id")


def _drain_until_settled(engine: Engine, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with Session(engine) as session:
            JobQueue(session, fast_mode=True, registry=reg).drain()
        with engine.connect() as conn:
            left = conn.execute(UNFINISHED).all()
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _check(engine: Engine, windows: list[WindowJobs]) -> None:
    with engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status::text FROM postjob.postjobs")).all())
        left = conn.execute(UNFINISHED).all()
    ours = [job_id for _, job_id in ran]
    problems: list[str] = []
    for w in windows:
        problems += [f"window {w.step}: {e}" for e in w.errors]
        by_release = [job_id for job_id, _ in w.taken_by_release]
        expected = {  # job -> runs of this code after the window
            w.taken: 0 if w.taken in by_release else 1,
            w.spare: 1,
            w.retried: 1,  # its failed attempt behind the step is retried
            w.parent: 1,  # woken: its child ended before its sleep
            w.child: 0,
        }
        for job_id, runs in expected.items():
            if ours.count(job_id) != runs:
                problems.append(f"window {w.step}: job {job_id} ran {ours.count(job_id)} "
                                f"times here, expected {runs} (status {statuses.get(job_id)})")
    if left:
        problems.append(f"unfinished after the drain: {left}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("release", [SERVED], ids=lambda r: f"{r.revision}-workers")
def test_released_calls_queued_behind_each_step_neither_run_a_job_twice_nor_lose_one(
        released_db: URL, release: Release) -> None:
    ran.clear()
    windows = run_window(released_db, release)
    assert len(windows) >= 3, "pj0009's, pj0010's and pj0011's steps that install functions: a window each"
    engine = create_engine(released_db)
    try:
        _drain_until_settled(engine)
        _check(engine, windows)
    finally:
        engine.dispose()
