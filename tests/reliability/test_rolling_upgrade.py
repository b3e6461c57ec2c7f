"""Upgrading while workers run: the schema is migrated to head under workers of the released
code (commit 3e9eeec, schema pj0008, the release the head serves) while jobs stream in; then
workers of this code join; then, with this code's workers stopped, the schema goes back down to
pj0008 under the released workers and more jobs come. No job is lost, none runs twice, no
worker crashes.

The released code is taken from git (``git archive``) into a temporary directory and run with
it first on PYTHONPATH: its ``postjob db migrate`` installs pj0001, its ``postjob run``
processes work, and an application of that code enqueues (tests/reliability/rolling_enqueuer.py)
before, during and after the migration. Without git or the commit the test fails: it must
not pass by not running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, RowMapping, create_engine, text

import postjob_sa
from postjob_sa._migrations import head_revision
from tests.conftest import create_clone, drop_database, url_string
from tests.reliability.conftest import (
    APP,
    ROOT,
    WorkerProcess,
    create_runs_table,
    report,
    scalar,
    wait_for,
)
from tests.reliability.releases import extracted, released_env, run_released
from tests.reliability.rolling_enqueuer import is_parent

pytestmark = pytest.mark.slow

#: The released code (commit, schema revision): the release the head serves (pj0008), the
#: one whose record pj0010 partitions under its workers (pj0009), and the release before the
#: head (pj0010, the last round's).
RELEASES = [("3e9eeec", "pj0008"), ("11edb20", "pj0009"), ("d779ba8", "pj0010")]
OLD_WORKERS = 3
NEW_WORKERS = 2
OLD_KEYS = (1, 301)  # enqueued by the released code, before, during and after the migration
NEW_KEYS = (10_001, 10_101)  # enqueued by this code once the schema is at head
LATE_KEYS = (20_001, 20_041)  # enqueued by the released code once the schema is back down
INTERVAL = "0.02"
RUNS_BEFORE = 5  # jobs each released worker runs before the migration
SLOW_JOBS, SLOW_SECONDS = OLD_WORKERS, 1.0  # running when the migration starts

@pytest.fixture(scope="module", params=RELEASES, ids=lambda r: f"{r[1]}-workers")
def release(request: pytest.FixtureRequest) -> tuple[str, str]:
    commit, revision = request.param
    return str(commit), str(revision)


@pytest.fixture(scope="module")
def released_code(release: tuple[str, str]) -> Iterator[Path]:
    """The released package, extracted from git into a directory of its own."""
    with extracted(release[0]) as path:
        yield path


class ReleasedWorker(WorkerProcess):
    """``postjob run`` of the released code (``python -m postjob_sa.cli``)."""

    def __init__(self, released: Path, url: URL):
        self.logfile = tempfile.NamedTemporaryFile(  # closed in stop()
            prefix="postjob-released-worker-", suffix=".log", delete=False
        )
        argv = [sys.executable, "-m", "postjob_sa.cli", "--database-url", url_string(url),
                "run", "--import", APP, "--fast"]
        self.proc = subprocess.Popen(argv, cwd=released, stdout=self.logfile,
                                     stderr=subprocess.STDOUT, env=released_env(released, url))
        self.pid = self.proc.pid


@pytest.fixture
def released_db(server_url: URL, template_db: str, released_code: Path,
                release: tuple[str, str]) -> Iterator[URL]:
    """A new database whose schema the released code installed (pj0001)."""
    url = create_clone(server_url, "template0", "rolling_upgrade")
    old_url = url.set(drivername="postgresql+psycopg2")  # the released code knows psycopg2 only
    res = run_released(released_code, old_url, "-m", "postjob_sa.cli", "--database-url",
                       url_string(old_url), "db", "migrate")
    assert res.returncode == 0, res.stderr
    assert f"from nothing to {release[1]}" in res.stdout, res.stdout
    yield url
    drop_database(server_url, url)


@pytest.fixture
def started() -> Iterator[list[WorkerProcess]]:
    """Every worker process a test starts; all are stopped at the end, whatever happened."""
    procs: list[WorkerProcess] = []
    yield procs
    for p in procs:
        p.stop(timeout=10)
        Path(p.logfile.name).unlink(missing_ok=True)


#: What a released worker logs when a child spawn of its fails in pj0010's window.
SPAWN_IN_PJ0010_WINDOW = ("InvalidColumnReference: there is no unique or exclusion constraint "
                          "matching the ON CONFLICT specification")


def _spent_in_pj0010_window(job: RowMapping, released_revision: str, logs: str) -> bool:
    """Whether ``job`` spent one attempt in the known window of pj0010's step, and nothing else
    went wrong with it (docs/operations.md, "One known window, upgrading from 0.1.0").

    A worker whose calls run pj0009's function bodies (a release older than pj0010: pj0009's
    steps commit before pj0010's) spawns children with an ``INSERT ... ON CONFLICT`` on the
    record's unique index of children. A spawn that begins while pj0010's step partitions the
    record resolves that body, waits for the step's lock, and is planned once the step
    commits, on the partitioned record, which has no such index: it fails (42P10) and the run's
    attempt is spent, then the job is retried. Both revisions are frozen history; the window is
    told here, exactly, rather than hidden."""
    return (released_revision < "pj0010" and job["workflow"] == "rel.parent"
            and (job["status"], job["failed_attempts"], job["error"]) == ("ok", 1, None)
            and re.search(rf"job {job['id']} \(rel\.parent\): err .*{re.escape(SPAWN_IN_PJ0010_WINDOW)}",
                          logs) is not None)


def _enqueuer(url: URL, keys: tuple[int, int], released: Path | None = None) -> subprocess.Popen[str]:
    """An application enqueuing keys (first, last): of the released code, or of this one."""
    argv = [sys.executable, "-m", "tests.reliability.rolling_enqueuer", url_string(url),
            str(keys[0]), str(keys[1]), INTERVAL]
    env = released_env(released, url) if released is not None else dict(os.environ)
    return subprocess.Popen(argv, cwd=released or ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out.strip()


#: The migration waits for its lock on the jobs table ...
MIGRATION_WAITING = (
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'postjob' "
    "AND c.relname = 'postjobs' AND l.mode = 'AccessExclusiveLock' AND NOT l.granted"
)
#: ... and a call of a worker (the released code's: record the outcomes of its jobs, check out
#: the next) waits behind it.
WORKERS_WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name LIKE 'postjob worker %' AND wait_event_type = 'Lock' "
    "AND query LIKE '%postjob%'"
)


def _migrate_behind_a_long_transaction(engine: Engine) -> None:
    """Migrate to head while a long transaction reads the jobs table (a report, an open psql
    session): the migration waits for its table lock (at most lock_timeout), the workers' calls
    queue behind it, as they do in production; then the transaction ends, the migration goes
    through, and the queued calls go on, on the new schema. Without the long transaction the
    window is as short as the migration's own transaction, and hit only now and then."""
    failed: list[BaseException] = []

    def migrate() -> None:
        try:
            postjob_sa.migrate(engine)
        except BaseException as exc:  # reported below, in the test's thread
            failed.append(exc)

    migration = threading.Thread(target=migrate)
    with engine.connect() as report_query:
        report_query.execute(text("SELECT count(*) FROM postjob.postjobs"))  # its lock: to the end
        migration.start()
        try:
            # a revision that only replaces function bodies (pj0011 from pj0010) takes no lock
            # of the record: it goes through beside the long transaction, and the workers' calls
            # run on, on the new bodies
            wait_for(lambda: scalar(engine, MIGRATION_WAITING) or not migration.is_alive(), 20,
                     "the migration waiting (or done without the record's lock)")
            if migration.is_alive():
                # (a step whose lock_timeout ends meanwhile tries again, and waits again)
                wait_for(lambda: scalar(engine, WORKERS_WAITING), 20,
                         "a worker's cycle queued behind it")
        finally:
            report_query.rollback()
            migration.join(60)
    assert not migration.is_alive() and failed == [], failed
    assert scalar(engine, "SELECT postjob.schema_version()") == head_revision()


def _runs_per_pid(engine: Engine, pids: list[int]) -> list[int]:
    with engine.connect() as conn:
        counts = dict(conn.execute(text("SELECT pid, count(*) FROM rel_runs GROUP BY pid")).all())
    return [int(counts.get(pid, 0)) for pid in pids]


def _runs_by_job(engine: Engine) -> dict[int, list[tuple[str, int]]]:
    runs: dict[int, list[tuple[str, int]]] = {}
    with engine.connect() as conn:
        for job_id, what, pid in conn.execute(text("SELECT job_id, what, pid FROM rel_runs ORDER BY at")):
            runs.setdefault(int(job_id), []).append((str(what), int(pid)))
    return runs


def test_migrating_under_workers_of_the_released_code_loses_no_job_and_runs_none_twice(
    released_db: URL, released_code: Path, started: list[WorkerProcess],
    workers: Callable[..., WorkerProcess], release: tuple[str, str],
) -> None:
    released_revision = release[1]
    probe = run_released(released_code, released_db, "-c", "import postjob_sa; print(postjob_sa.__file__)")
    assert probe.stdout.strip().startswith(str(released_code)), probe  # the released code runs

    engine = create_engine(released_db)
    try:
        create_runs_table(engine)
        old_url = released_db.set(drivername="postgresql+psycopg2")

        # the released code at work: its workers, and its application enqueuing
        old = [ReleasedWorker(released_code, old_url) for _ in range(OLD_WORKERS)]
        started.extend(old)
        old_app = _enqueuer(old_url, OLD_KEYS, released_code)
        old_pids = [p.pid for p in old]
        wait_for(lambda: min(_runs_per_pid(engine, old_pids)) >= RUNS_BEFORE, 60,
                 f"each released worker ran {RUNS_BEFORE} jobs")

        # jobs that are running when the migration starts and end while it waits for its lock:
        # their workers' next call (record the outcome, check out the next) queues behind it
        with engine.begin() as conn:  # as session.add(Job(...)) enqueues, whatever the code
            conn.execute(text("INSERT INTO postjob.postjobs (workflow, args) "
                              "SELECT 'rel.slow', jsonb_build_array(CAST(:s AS float8), 'slow ' || n) "
                              "FROM generate_series(1, :n) n"), {"s": SLOW_SECONDS, "n": SLOW_JOBS})
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM rel_runs WHERE what = 'start'"), 20,
                 "a slow job running")

        # migrate to head under them, while jobs keep coming; its lock waits behind a long
        # transaction, and calls of the workers queue behind it
        _migrate_behind_a_long_transaction(engine)
        migrated_at = scalar(engine, "SELECT clock_timestamp()")

        # then this code joins: its workers and its application
        new = [workers(released_db, "--fast") for _ in range(NEW_WORKERS)]
        new_app = _enqueuer(released_db, NEW_KEYS)
        assert _finish(old_app).startswith(str(released_code))  # enqueued by the released code
        assert not _finish(new_app).startswith(str(released_code))

        # no worker crashed (a crashed worker's job would wait for its lease to end)
        for p in old + new:
            assert p.alive(), f"worker {p.pid} exited:\n{p.log()}"

        expected_roots = (OLD_KEYS[1] - OLD_KEYS[0]) + (NEW_KEYS[1] - NEW_KEYS[0]) + SLOW_JOBS
        expected_parents = sum(1 for r in (range(*OLD_KEYS), range(*NEW_KEYS))
                               for k in r if is_parent(k))
        expected_jobs = expected_roots + expected_parents  # one child per parent
        wait_for(lambda: scalar(engine, "SELECT count(*) FILTER (WHERE status IN "
                                        "('ok', 'failed', 'timeout')) FROM postjob.postjobs")
                 >= expected_jobs, 90, f"{expected_jobs} jobs finished")

        for p in new:  # this code's workers stop cleanly ...
            assert p.stop() == 0, p.log()
            assert not re.search(r"Traceback|SchemaError|ERROR", p.log()), p.log()

        # ... and the schema goes back down under the released workers, which go on
        postjob_sa.downgrade(engine, released_revision)
        assert scalar(engine, "SELECT postjob.schema_version()") == released_revision
        late_app = _enqueuer(old_url, LATE_KEYS, released_code)
        _finish(late_app)
        expected_jobs += (LATE_KEYS[1] - LATE_KEYS[0]) + sum(1 for k in range(*LATE_KEYS)
                                                             if is_parent(k))
        wait_for(lambda: scalar(engine, "SELECT count(*) FILTER (WHERE status IN "
                                        "('ok', 'failed', 'timeout')) FROM postjob.postjobs")
                 >= expected_jobs, 90, f"{expected_jobs} jobs finished after the downgrade")
        for p in old:  # and every released worker stops cleanly
            assert p.stop() == 0, p.log()
            assert not re.search(r"Traceback|SchemaError|ERROR", p.log()), p.log()

        # every job ran to ok at the first attempt: none failed, none was a zombie (but for
        # the known window of pj0010's step: _spent_in_pj0010_window)
        with engine.connect() as conn:
            jobs = conn.execute(text(
                "SELECT id, parent_id, workflow, args, status::text AS status, results, "
                "failed_attempts, error FROM postjob.postjobs ORDER BY id")).mappings().all()
        assert len(jobs) == expected_jobs
        logs = "\n".join(p.log() for p in old)
        bad = [dict(j) for j in jobs if (j["status"], j["failed_attempts"], j["error"]) != ("ok", 0, None)
               and not _spent_in_pj0010_window(j, released_revision, logs)]
        assert bad == [], "\n".join([repr(bad)] + [  # with what the workers said of them
            line for p in old + new for line in p.log().splitlines()
            if any(f"job {b['id']} " in line for b in bad)])
        spent = sum(1 for j in jobs if j["failed_attempts"])

        # and each body ran exactly once (a parent re-runs when its child is done: at most twice,
        # finding the same child)
        runs = _runs_by_job(engine)
        children = {int(j["parent_id"]): j for j in jobs if j["parent_id"] is not None}
        for j in jobs:
            did = [what for what, _ in runs.get(int(j["id"]), [])]
            if j["workflow"] == "rel.record":
                assert did == ["run"], (j, did)
            elif j["workflow"] == "rel.child":
                assert did == ["child"], (j, did)
            elif j["workflow"] == "rel.slow":
                assert did == ["start", "end"], (j, did)
            else:
                child = children[int(j["id"])]
                assert did in ([f"spawned {child['id']}"], [f"spawned {child['id']}"] * 2), (
                    j, runs.get(int(j["id"])), child, runs.get(int(child["id"])), migrated_at,
                    [p.pid for p in old], [p.pid for p in new])  # who ran what, to tell why
                assert j["results"] == [j["args"][0] * 10 + 1]

        # the released workers worked before and after the migration, and this code's too
        new_pids = [p.pid for p in new]
        with engine.connect() as conn:
            by_phase = conn.execute(text(
                "SELECT count(*) FILTER (WHERE pid = ANY(:old) AND at < :m), "
                "count(*) FILTER (WHERE pid = ANY(:old) AND at > :m), "
                "count(*) FILTER (WHERE pid = ANY(:new)) FROM rel_runs"),
                {"old": old_pids, "new": new_pids, "m": migrated_at}).one()
        assert all(by_phase), by_phase
        report(f"rolling upgrade {released_revision} -> {head_revision()} and back: {len(jobs)} jobs, "
               f"released workers ran {by_phase[0]} before and {by_phase[1]} after the migration, "
               f"new workers {by_phase[2]}; none lost, none twice; attempts spent in pj0010's "
               f"window: {spent}")
    finally:
        engine.dispose()

