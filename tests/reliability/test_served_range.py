"""The range of code a schema says it serves is honest. The oldest served release (pj0008's,
commit 3e9eeec) works on the newest schema with jobs in every state present, a cancelled child
included (its parent catches ChildFailed); code of a release before it (pj0007's, commit
4021fd5, which knew neither postjob.unfinished nor its lease) is refused at start, in one line,
before it touches a job."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Status
from tests.conftest import create_clone, drop_database, url_string
from tests.reliability.conftest import APP, create_runs_table, scalar, wait_for
from tests.reliability.releases import extracted, released_env

pytestmark = pytest.mark.slow

OLDEST_SERVED = "3e9eeec"  # pj0008
BEFORE_IT = "4021fd5"  # pj0007


@pytest.fixture
def newest(server_url: URL, template_db: str) -> Iterator[Engine]:
    """A database at the newest schema, with the side table of the workflows' records."""
    url = create_clone(server_url, template_db, "served_range")
    engine = create_engine(url)
    create_runs_table(engine)
    yield engine
    engine.dispose()
    drop_database(server_url, url)


def _released_worker(code: Path, engine: Engine, *args: str) -> subprocess.Popen[str]:
    url = engine.url.set(drivername="postgresql+psycopg2")
    return subprocess.Popen(
        [sys.executable, "-m", "postjob_sa.cli", "--database-url", url_string(url), "run",
         "--import", APP, "--fast", *args],
        cwd=code, env=released_env(code, engine.url), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _every_state(engine: Engine) -> None:
    """One job of each status (besides the ones the test runs)."""
    with engine.begin() as conn:
        for status in Status:
            if status is not Status.processing:
                conn.execute(text(
                    "INSERT INTO postjob.postjobs (workflow, status, next_run_at) VALUES "
                    "('other.thing', CAST(:s AS postjob.statuses), now() + interval '1 day')"),
                    {"s": status.value})
    with Session(engine) as s:  # and one running, under a lease of this code's checkout
        q = JobQueue(s, registry=postjob_sa.Registry())
        q.enqueue("other.running")
        s.commit()
        s.execute(text("SELECT postjob.checkout_v4(NULL, 'x', ARRAY['other.running'], "
                       "ARRAY[''], NULL, 1, 600, true, false, false)"))
        s.commit()


def test_the_oldest_served_release_runs_on_the_newest_schema_with_every_state(
    newest: Engine,
) -> None:
    _every_state(newest)
    with Session(newest) as s:
        parent = JobQueue(s).enqueue("rel.catcher").id
        s.commit()
    with extracted(OLDEST_SERVED) as code:
        worker = _released_worker(code, newest)
        try:
            step = None
            deadline = time.monotonic() + 30
            while step is None and time.monotonic() < deadline:  # the parent asleep on its step
                step = scalar(newest, f"SELECT id FROM postjob.jobs WHERE parent_id = {parent}")
                time.sleep(0.05)
            assert step is not None, "the released worker did not run the parent"
            with Session(newest) as s:
                JobQueue(s).cancel(step)
                s.commit()
            wait_for(lambda: scalar(newest, "SELECT status::text FROM postjob.jobs "
                                            f"WHERE id = {parent}") == "ok", 30,
                     "the parent ok, having caught ChildFailed")
        finally:
            worker.terminate()
            out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "Traceback" not in err and "is not a valid Status" not in err, err
    assert scalar(newest, f"SELECT results FROM postjob.postjobs WHERE id = {parent}") == [
        "child cancelled"]


def test_code_older_than_the_oldest_served_is_refused_at_start(newest: Engine) -> None:
    with Session(newest) as s:
        job_id = JobQueue(s).enqueue("rel.record", 1).id
        s.commit()
    with extracted(BEFORE_IT) as code:
        worker = _released_worker(code, newest)
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 2, (out, err)
    assert "no longer serves this code" in err and "upgrade postjob_sa" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert scalar(newest, f"SELECT status::text FROM postjob.postjobs WHERE id = {job_id}") == "ready"
