"""The upgrade window, reproduced deterministically: calls of a released worker that resolved
their function bodies before a revision's step committed, and queued behind its lock.

A worker's call (``SELECT ... FROM postjob.worker_cycle...(...)``) resolves the body of the
function it calls when it starts. If a migration step holds (or waits for) a lock on the
tables that body touches, the call queues behind it, and once the step commits, the call goes
on with the *old* body on the *new* storage. Nothing in a revision may let such a call change
the new storage wrongly: it fails cleanly (with an error its worker tries again), or it is
safe there.

:func:`run_window` drives every step of a migration to head that installs function bodies:
before the step, the released worker (simulated by the release's own SQL, taken from git) has
jobs in hand; a reporting transaction holds the jobs table; the step waits for it; the released
worker's checkout and its outcomes queue behind the step; the reporting transaction ends; the
step commits; the queued calls go on. Afterwards this code drains the queue. A job run twice or
never again shows up as a failed assertion of the caller.
"""

from __future__ import annotations

import ast
import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import URL, create_engine

import postjob_sa
from postjob_sa.alembic import _steps
from tests.conftest import dbapi_connect
from tests.reliability.conftest import ROOT

#: The SQLSTATEs a released worker tries again as they are (a conflict with another
#: transaction): a call that fails with one of them failed cleanly.
RETRIED_STATES = {"40001", "40P01", "55P03"}


def released_statement(commit: str, name: str) -> str:
    """The statement ``name`` of ``postjob_sa/_sql.py`` at ``commit`` (read with git, never
    imported: it is the released code's, not this code's)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:postjob_sa/_sql.py"],
                            capture_output=True, text=True, check=True, timeout=60).stdout
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
            value = ast.literal_eval(node.value)
            assert isinstance(value, str)
            return value
    raise AssertionError(f"{commit}:postjob_sa/_sql.py has no statement {name}")


@dataclass
class Release:
    """A released worker's cycle: its statement, and the parameters it sends for a checkout of
    one job and for a batch of outcomes (``(id, lease_token, kind, awaited_id)``)."""

    commit: str
    revision: str
    checkout: Callable[[str], dict[str, Any]]
    outcomes: Callable[[list[tuple[int, int, str, int | None]]], dict[str, Any]]

    @property
    def cycle(self) -> str:
        return released_statement(self.commit, "WORKER_CYCLE")


def _pj0007_checkout(workflow: str) -> dict[str, Any]:
    return {"worker_id": None, "identifier": "released", "ids": [], "leases": [],
            "outcomes": [], "results": [], "errors": [], "messages": [], "backtraces": [],
            "versions": [], "awaiting": [], "workflows": [workflow], "workflow_versions": [""],
            "queues": None, "limit": 1, "lease": 60.0, "fast": True, "reap": False}


def _pj0007_outcomes(batch: list[tuple[int, int, str, int | None]]) -> dict[str, Any]:
    return {"worker_id": None, "identifier": "released",
            "ids": [b[0] for b in batch], "leases": [b[1] for b in batch],
            "outcomes": [b[2] for b in batch],
            "results": [json.dumps([b[0]]) if b[2] == "ok" else None for b in batch],
            "errors": ["Boom" if b[2] == "err" else None for b in batch],
            "messages": ["boom" if b[2] == "err" else None for b in batch],
            "backtraces": [None for _ in batch], "versions": ["" for _ in batch],
            "awaiting": [b[3] for b in batch], "workflows": [], "workflow_versions": [],
            "queues": None, "limit": 0, "lease": 60.0, "fast": True, "reap": False}


#: The release of schema pj0007 (its workers call postjob.worker_cycle).
PJ0007 = Release("4021fd5", "pj0007", _pj0007_checkout, _pj0007_outcomes)


def _pj0008_checkout(workflow: str) -> dict[str, Any]:
    return {"worker_id": None, "identifier": "released", "ok_ids": "{}", "ok_tokens": "{}",
            "ok_results": "{}", "ok_versions": "{}", "outcomes": "[]", "done": "{}",
            "workflows": [workflow], "versions": [""], "queues": None, "limit": 1,
            "lease": 60.0, "reap": False, "promote": False}


def _pj0008_outcomes(batch: list[tuple[int, int, str, int | None]]) -> dict[str, Any]:
    ok = [b for b in batch if b[2] == "ok"]
    others = [[b[0], b[1], b[2], None, "Boom" if b[2] == "err" else None,
               "boom" if b[2] == "err" else None, None, "", b[3],
               0.01 if b[2] == "err" else None] for b in batch if b[2] != "ok"]
    return {"worker_id": None, "identifier": "released",
            "ok_ids": "{" + ",".join(str(b[0]) for b in ok) + "}",
            "ok_tokens": "{" + ",".join(str(b[1]) for b in ok) + "}",
            "ok_results": "{" + ",".join(json.dumps(json.dumps([b[0]])) for b in ok) + "}",
            "ok_versions": "{" + ",".join('""' for _ in ok) + "}",
            "outcomes": json.dumps(others), "done": "{}",
            "workflows": [], "versions": [], "queues": None, "limit": 0, "lease": 60.0,
            "reap": False, "promote": False}


#: The release of schema pj0008 (its workers call postjob.worker_cycle_v3).
PJ0008 = Release("3e9eeec", "pj0008", _pj0008_checkout, _pj0008_outcomes)


@dataclass
class Call:
    """One call of the released worker, made on a connection of its own (in a thread)."""

    sql: str
    params: dict[str, Any]
    conn: Any
    pid: int = 0
    rows: list[tuple[Any, ...]] | None = None
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        def run() -> None:
            try:
                with contextlib.closing(self.conn.cursor()) as cur:
                    cur.execute(self.sql, self.params)
                    self.rows = list(cur.fetchall())
            except BaseException as exc:  # looked at by the test
                self.error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self, timeout: float = 60) -> None:
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"a released call did not return: {self.sql[:80]}"

    @property
    def sqlstate(self) -> str | None:
        exc = self.error
        return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


@dataclass
class WindowJobs:
    """The jobs of one window: what the released worker holds when the step begins, and what
    its calls behind the step do with them."""

    step: int
    taken: int  # due when the step begins; the checkout behind the step takes it
    spare: int  # due, of a workflow the released checkout does not ask for
    retried: int  # held by the released worker; behind the step it fails (err: retried)
    retried_token: int
    parent: int  # held; behind the step it sleeps for its child, which has ended (woken)
    parent_token: int
    child: int  # the parent's child, run to ok by the released worker before the step
    taken_by_release: list[tuple[int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _one(conn: Any, sql: str, params: dict[str, Any] | None = None) -> Any:
    with contextlib.closing(conn.cursor()) as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
        return None if row is None else row[0]


class ReleasedWorker:
    """The released code's worker, as its cycle statement calls the database."""

    def __init__(self, release: Release, url: URL):
        self.release = release
        self.url = url
        self.cycle = release.cycle
        self.conn = dbapi_connect(url)

    def close(self) -> None:
        self.conn.close()

    def call(self, params: dict[str, Any]) -> Call:
        return Call(self.cycle, params, dbapi_connect(self.url))

    def run(self, params: dict[str, Any], tries: int = 5) -> list[tuple[Any, ...]]:
        """A call as the released worker makes it, tried again on a conflict as it would."""
        for attempt in range(tries):
            call = Call(self.cycle, params, self.conn)
            call.start()
            call.join()
            if call.error is None:
                assert call.rows is not None
                return call.rows
            if call.sqlstate not in RETRIED_STATES or attempt == tries - 1:
                raise call.error
            time.sleep(0.05)
        raise AssertionError("unreachable")

    def checkout(self, workflow: str) -> list[tuple[int, int]]:
        rows = self.run(self.release.checkout(workflow))
        return [(int(r[1]), int(r[_token_column(self.cycle)])) for r in rows if r[0] == "job"]

    def finish(self, batch: list[tuple[int, int, str, int | None]]) -> list[int]:
        """Record outcomes; the ids the database called lost."""
        rows = self.run(self.release.outcomes(batch))
        return [int(r[1]) for r in rows if r[0] == "lost"]


def _token_column(cycle: str) -> int:
    columns = [c.strip() for c in cycle.split("FROM")[0].removeprefix("SELECT").split(",")]
    return columns.index("lease_token")


INSERT_JOB = (
    "INSERT INTO postjob.postjobs (workflow, args, parent_id) "
    "VALUES (%(workflow)s, '[]'::jsonb, %(parent)s) RETURNING id")


def seed(worker: ReleasedWorker, step: int) -> WindowJobs:
    """Jobs for the window before step ``step``, left as the released worker leaves them."""
    conn = worker.conn

    def add(workflow: str, parent: int | None = None) -> int:
        return int(_one(conn, INSERT_JOB, {"workflow": f"{workflow}.{step}", "parent": parent}))

    retried, parent = add("win.retried"), add("win.parent")
    [(got_retried, retried_token)] = worker.checkout(f"win.retried.{step}")
    [(got_parent, parent_token)] = worker.checkout(f"win.parent.{step}")
    assert (got_retried, got_parent) == (retried, parent), "the released worker took its jobs"
    child = add("win.child", parent)  # as the parent's run spawns it
    [(got_child, child_token)] = worker.checkout(f"win.child.{step}")
    assert got_child == child
    assert worker.finish([(child, child_token, "ok", None)]) == []
    return WindowJobs(step, taken=add("win.taken"), spare=add("win.spare"), retried=retried,
                      retried_token=retried_token, parent=parent, parent_token=parent_token,
                      child=child)


#: The migration's connection (its application_name).
MIGRATION = "postjob upgrade window"
MIGRATION_PID = ("SELECT pid FROM pg_stat_activity WHERE application_name = 'postjob upgrade window' "
                 "AND datname = current_database()")
#: A backend waits for a lock.
WAITING = ("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%(pids)s) "
           "AND wait_event_type = 'Lock'")


def _wait_until(conn: Any, pids: list[int], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while int(_one(conn, WAITING, {"pids": pids})) < len(pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        time.sleep(0.01)


def _installs_functions(sql: str) -> bool:
    return "CREATE OR REPLACE FUNCTION" in sql or "CREATE FUNCTION" in sql


@contextlib.contextmanager
def _step_hook(before: Callable[[str], None]) -> Iterator[None]:
    """Every step a revision runs in a transaction of its own calls ``before(sql)`` first (the
    revisions bind the step functions when Alembic loads them, which it does at each run)."""
    originals = (_steps.own_transaction, _steps.own_transaction_retried)
    inside: list[bool] = []  # own_transaction_retried runs own_transaction: one call of before

    def hooked(original: Callable[..., None]) -> Callable[..., None]:
        def step(sql: str, **kw: Any) -> None:
            if not inside:
                before(sql)
            inside.append(True)
            try:
                original(sql, **kw)
            finally:
                inside.pop()
        return step

    own_transaction, own_transaction_retried = hooked(originals[0]), hooked(originals[1])
    _steps.own_transaction, _steps.own_transaction_retried = own_transaction, own_transaction_retried
    try:
        yield
    finally:
        _steps.own_transaction, _steps.own_transaction_retried = originals


def run_window(url: URL, release: Release, target: str = "heads") -> list[WindowJobs]:
    """Migrate the database (at the release's revision) to ``target``, with the released
    worker's calls queued behind every step that installs function bodies (see the module
    docstring). Returns the windows' jobs; the released worker's calls have ended (their
    errors, if any, in ``errors``), and the jobs it checked out behind a step were recorded
    ok by it afterwards (as its next cycle would)."""
    engine = create_engine(url, connect_args={"application_name": MIGRATION})
    worker = ReleasedWorker(release, url)
    watcher = dbapi_connect(url)
    windows: list[WindowJobs] = []
    pending: list[tuple[WindowJobs, Call, Call]] = []
    step_started = threading.Event()
    step_may_go = threading.Event()

    def before(sql: str) -> None:
        if not _installs_functions(sql):
            return
        _finish_pending(worker, pending)  # the calls queued behind the previous step
        windows.append(seed(worker, len(windows) + 1))
        step_started.set()
        assert step_may_go.wait(60), "the test did not hold the table in time"
        step_may_go.clear()

    failed: list[BaseException] = []

    def migrate() -> None:
        try:
            postjob_sa.migrate(engine, target)
        except BaseException as exc:  # reported in the test's thread
            failed.append(exc)

    try:
        with _step_hook(before):
            migration = threading.Thread(target=migrate, daemon=True)
            migration.start()
            while migration.is_alive():
                if not step_started.wait(0.05):
                    continue
                step_started.clear()
                jobs = windows[-1]
                report = dbapi_connect(url)
                report.autocommit = False
                with contextlib.closing(report.cursor()) as cur:  # a report: holds the table
                    cur.execute("SELECT count(*) FROM postjob.postjobs")
                step_may_go.set()
                _wait_until(watcher, [int(_one(watcher, MIGRATION_PID))],
                            "the step waiting for the report")
                checkout = worker.call(release.checkout(f"win.taken.{jobs.step}"))
                outcomes = worker.call(release.outcomes([
                    (jobs.retried, jobs.retried_token, "err", None),
                    (jobs.parent, jobs.parent_token, "sleep", jobs.child)]))
                for call in (checkout, outcomes):
                    call.pid = int(_one(call.conn, "SELECT pg_backend_pid()"))
                    call.start()
                    _wait_until(watcher, [call.pid], "a released call queued behind the step")
                report.rollback()  # the report ends: the step goes through, then the calls
                report.close()
                pending.append((jobs, checkout, outcomes))
            migration.join()
            assert failed == [], failed
            _finish_pending(worker, pending)
    finally:
        worker.close()
        watcher.close()
        engine.dispose()
    return windows


def _finish_pending(worker: ReleasedWorker, pending: list[tuple[WindowJobs, Call, Call]]) -> None:
    """The released worker after its calls behind a step: a call that failed cleanly is made
    again (as its worker does); the job its checkout took runs and is recorded ok."""
    while pending:
        jobs, checkout, outcomes = pending.pop(0)
        for call in (checkout, outcomes):
            call.join()
            call.conn.close()
            if call.error is not None:
                if call.sqlstate not in RETRIED_STATES:
                    jobs.errors.append(f"{call.sqlstate}: {call.error}")
                    continue
                call.rows = worker.run(call.params)
        taken = [(int(r[1]), int(r[_token_column(worker.cycle)]))
                 for r in checkout.rows or [] if r[0] == "job"]
        jobs.taken_by_release = taken
        lost = worker.finish([(job_id, token, "ok", None) for job_id, token in taken])
        if lost:
            jobs.errors.append(f"the run of {lost} the released worker checked out was lost")
        for r in outcomes.rows or []:
            if r[0] == "lost":
                jobs.errors.append(f"the released outcome of job {r[1]} was lost")
