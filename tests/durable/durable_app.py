"""Workflows of the durable tests, in process and in ``postjob run`` workers (``--import
tests.durable.durable_app``). What their bodies do is recorded in the side table ``rel_runs``
(tests.reliability.rel_app.record: a connection of its own), so a record is evidence that the
code ran, whatever became of the job."""

from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import EventTimeout, NonRecoverable


def record(what: str) -> None:
    """Insert (the running job's id, pid, what) into rel_runs, on a connection of its own
    (opened and closed here: job bodies run in threads the tests do not own)."""
    driver: Any = importlib.import_module(os.environ.get("POSTJOB_TEST_DRIVER") or "psycopg")
    conn = driver.connect(os.environ["REL_APP_URL"])
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO rel_runs (job_id, pid, what) VALUES (%s, %s, %s)",
                        (postjob_sa.current_job().id, os.getpid(), what))
        conn.commit()
    finally:
        conn.close()


def _charge(amount: int) -> int:
    record("charge")
    return amount


@postjob_sa.workflow(name="dur.child")
def child(i: int) -> int:
    return i * 10


@postjob_sa.workflow(name="dur.charge_once")
def charge_once(children: int) -> int:
    """A step, then children one after another: the parent is woken once per child."""
    charged: int = postjob_sa.step("charge", _charge, 42)
    record("parent run")
    total = sum(child.spawn(i).result() for i in range(children))
    return charged + total


@postjob_sa.workflow(name="dur.charge_once_async")
async def charge_once_async(children: int) -> int:
    async def charge(amount: int) -> int:
        record("charge")
        return amount

    charged: int = await postjob_sa.step_async("charge", charge, 42)
    total = 0
    for i in range(children):
        total += await child.spawn(i)
    return charged + total


@postjob_sa.workflow(name="dur.twice")
def twice() -> int:
    postjob_sa.step("same", _charge, 1)
    return int(postjob_sa.step("same", _charge, 2))


@postjob_sa.workflow(name="dur.flaky_step", max_attempts=3)
def flaky_step() -> str:
    def attempt() -> str:
        record("attempt")
        if postjob_sa.current_job().attempt == 1:
            raise RuntimeError("not yet")
        return "done"

    return str(postjob_sa.step("flaky", attempt))


class CardDeclined(NonRecoverable):
    pass


@postjob_sa.workflow(name="dur.declined")
def declined(nap: float) -> str:
    def charge() -> None:
        record("charge")
        raise CardDeclined("insufficient funds")

    try:
        postjob_sa.step("charge", charge)
        outcome = "charged"
    except CardDeclined as exc:
        outcome = f"declined: {exc}"
    postjob_sa.sleep(nap)  # a re-run replays the stored error
    return outcome


@postjob_sa.workflow(name="dur.args")
def with_args(amount: int) -> int:
    return int(postjob_sa.step("charge", _charge, amount))


@postjob_sa.workflow(name="dur.blocking_step")
def blocking_step(seconds: float) -> str:
    def slow() -> str:
        record("step started")
        time.sleep(seconds)
        record("step ended")
        return "slow"

    first = postjob_sa.step("first", _charge, 1)
    return f"{first} {postjob_sa.step('slow', slow)}"


@postjob_sa.workflow(name="dur.tx_step", transactional=True)
def tx_step(session: Session, fail_first: bool) -> int:
    def write() -> int:
        session.execute(text("INSERT INTO rel_runs (job_id, pid, what) VALUES (:j, 0, 'tx')"),
                        {"j": postjob_sa.current_job().id})
        return 7

    value = int(postjob_sa.step("write", write))
    if fail_first and postjob_sa.current_job().attempt == 1:
        raise RuntimeError("after the step")
    return value


@postjob_sa.workflow(name="dur.nap")
def nap(seconds: float, pause: float = 0) -> str:
    postjob_sa.step("before", _charge, 1)
    time.sleep(pause)
    postjob_sa.sleep(seconds)
    record("after")
    return "woke"


def _wait_for_go(timeout: float = 60.0) -> None:
    """Block until the test records 'go' for the running job in rel_runs (the test's gate)."""
    driver: Any = importlib.import_module(os.environ.get("POSTJOB_TEST_DRIVER") or "psycopg")
    conn = driver.connect(os.environ["REL_APP_URL"])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM rel_runs WHERE job_id = %s AND what = 'go'",
                            (postjob_sa.current_job().id,))
                found = cur.fetchone() is not None
            conn.rollback()
            if found:
                return
            time.sleep(0.02)
        raise RuntimeError("the test never said go")
    finally:
        conn.close()


@postjob_sa.workflow(name="dur.nap_gated")
def nap_gated(seconds: float) -> str:
    """dur.nap, but between its step and its sleep it waits for the test's 'go'."""
    postjob_sa.step("before", _charge, 1)
    _wait_for_go()
    postjob_sa.sleep(seconds)
    record("after")
    return "woke"


@postjob_sa.workflow(name="dur.nap_async")
async def nap_async(seconds: float) -> str:
    await postjob_sa.sleep_async(seconds)
    record("after")
    return "woke"


@postjob_sa.workflow(name="dur.nap_tx", transactional=True)
def nap_tx(session: Session, seconds: float) -> str:
    postjob_sa.sleep(seconds)
    return "woke"


@postjob_sa.workflow(name="dur.nap_until")
def nap_until(when: str) -> str:
    from datetime import datetime

    postjob_sa.sleep_until(datetime.fromisoformat(when))
    return "woke"


@postjob_sa.workflow(name="dur.waiter")
def waiter(key: str, timeout: float | None = None) -> Any:
    try:
        payload = postjob_sa.wait_for_event(key, timeout)
    except EventTimeout:
        record("timeout")
        return "timeout"
    record("delivered")
    return payload


@postjob_sa.workflow(name="dur.waiter_async")
async def waiter_async(key: str, timeout: float | None = None) -> Any:
    try:
        return await postjob_sa.wait_for_event_async(key, timeout)
    except EventTimeout:
        return "timeout"


@postjob_sa.workflow(name="dur.waiter_tx", transactional=True)
def waiter_tx(session: Session, key: str) -> Any:
    return postjob_sa.wait_for_event(key)


@postjob_sa.workflow(name="dur.wait_then_nap")
def wait_then_nap(key: str, timeout: float, seconds: float) -> Any:
    """A timeout caught, then a sleep: the re-run after the sleep must take the same branch
    even though an event came meanwhile."""
    try:
        got = postjob_sa.wait_for_event(key, timeout)
    except EventTimeout:
        got = "timed out"
    postjob_sa.sleep(seconds)
    return got


@postjob_sa.workflow(name="dur.killed_step")
def killed_step(seconds: float) -> str:
    """A stored step, then a step whose first attempt blocks (its worker is killed there)."""

    def slow() -> str:
        record("step started")
        if postjob_sa.current_job().attempt == 1:
            time.sleep(seconds)
        record("step ended")
        return "slow"

    first = postjob_sa.step("first", _charge, 1)
    return f"{first} {postjob_sa.step('slow', slow)}"


#: Opened by an in-process test (a worker thread of its own runs dur.waiter_gated).
WAITER_GATE = threading.Event()


@postjob_sa.workflow(name="dur.waiter_gated")
def waiter_gated(key: str) -> Any:
    """Waits for the event once the test opens WAITER_GATE (it holds a lock by then)."""
    if not WAITER_GATE.wait(60):
        raise RuntimeError("the test never opened the gate")
    return postjob_sa.wait_for_event(key)


@postjob_sa.workflow(name="dur.nest")
def nest(depth: int) -> int:
    """A chain of ``depth`` descendants: each job waits for its one child."""
    if depth == 0:
        return 0
    return int(nest.spawn(depth - 1).result()) + 1


@postjob_sa.workflow(name="dur.nest_async")
async def nest_async(depth: int) -> int:
    if depth == 0:
        return 0
    return int(await nest_async.spawn(depth - 1)) + 1
