"""Jobs whose workflow no running worker knows never run: workers say so (at start, and now
and then while idle, with a count per name), ``postjob ps`` marks them, and the query behind it
stays cheap on a big table. Manual steps wait for a person, never for a worker."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry, _sql
from postjob_sa.worker import unknown
from tests.cli.test_cli_db import POSTJOB
from tests.conftest import url_string

reg = Registry()


@postjob_sa.workflow(name="known.echo", registry=reg)
def echo(value: Any = None) -> Any:
    return value


LONG_NAME = "app.billing.workflows.monthly.send_monthly_invoice_reminder"


@pytest.fixture
def waiting(engine: Engine, clean: None) -> Iterator[dict[str, int]]:
    """Three due jobs of '__main__.ping', one of 'app.typo' (err, due), one of 'later.job'
    (not due yet), an open manual step and a finished job of an unknown workflow."""
    rows = [("__main__.ping", "ready", "0"), ("__main__.ping", "ready", "0"),
            ("__main__.ping", "ready", "0"), ("app.typo", "err", "0"),
            ("later.job", "ready", "3600"), ("__manual__", "ready", "0"), ("gone.job", "ok", "0"),
            (LONG_NAME, "ready", "0")]
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM postjob.workers"))
        ids = [int(conn.execute(text(
            "INSERT INTO postjob.postjobs (workflow, status, next_run_at) "
            "VALUES (:w, CAST(:s AS postjob.statuses), now() + make_interval(secs => :d)) "
            "RETURNING id"), {"w": w, "s": s, "d": float(d)}).scalar_one()) for w, s, d in rows]
    yield {"ping": ids[0], "typo": ids[3], "later": ids[4], "manual": ids[5], "gone": ids[6],
           "long": ids[7]}
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM postjob.workers"))


def _live_worker(engine: Engine, *workflows: str) -> None:
    """A worker registered elsewhere, alive for a minute."""
    with engine.begin() as conn:
        conn.execute(text("SELECT postjob.register_worker('elsewhere:1', 60, 'pj0002', "
                          "CAST(:w AS text[]), NULL)"), {"w": list(workflows)})


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "postjob_sa.worker" and "no running worker knows" in r.getMessage()]


EXPECTED = (
    "due jobs wait for workflows that no running worker knows: '__main__.ping' (3 jobs), "
    f"'{LONG_NAME}' (1 job), 'app.typo' (1 job); start a worker that imports them (postjob run "
    "--import MODULE) or fix their names (postjob ps marks these jobs). A name starting with "
    "__main__. comes from a workflow defined in a script run directly: give it a name, "
    "@postjob_sa.workflow(name=...)"
)


def test_a_worker_warns_at_start_with_a_count_per_unknown_workflow(
    engine: Engine, waiting: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    with Session(engine) as s, caplog.at_level(logging.WARNING, logger="postjob_sa"):
        assert JobQueue(s, registry=reg).drain() == 0
    assert _warnings(caplog) == [EXPECTED]


def test_workflows_another_live_worker_knows_are_not_unknown(
    engine: Engine, waiting: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    _live_worker(engine, "__main__.ping", LONG_NAME)
    with Session(engine) as s, caplog.at_level(logging.WARNING, logger="postjob_sa"):
        JobQueue(s, registry=reg).drain()
    assert _warnings(caplog) == [
        "due jobs wait for workflows that no running worker knows: 'app.typo' (1 job); start a "
        "worker that imports them (postjob run --import MODULE) or fix their names (postjob ps "
        "marks these jobs)"
    ]
    with engine.begin() as conn:  # that worker's heartbeat stopped: it knows nothing any more
        conn.execute(text("UPDATE postjob.workers SET expires_at = now() - interval '1 second'"))
    caplog.clear()
    with Session(engine) as s, caplog.at_level(logging.WARNING, logger="postjob_sa"):
        JobQueue(s, registry=reg).drain()
    assert _warnings(caplog) == [EXPECTED]


def test_an_idle_worker_warns_again_now_and_then(
    engine: Engine, waiting: dict[str, int], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(unknown, "CHECK_INTERVAL", 0.2)
    done: list[int] = []

    def work() -> None:  # a short lease: the idle worker wakes to beat every 0.2 s
        with Session(engine) as s:
            done.append(JobQueue(s, registry=reg, lease=0.6).work(count=1))

    with caplog.at_level(logging.WARNING, logger="postjob_sa"):
        worker = threading.Thread(target=work)
        worker.start()
        try:
            deadline = time.monotonic() + 15
            while len(_warnings(caplog)) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            with Session(engine) as s:  # a job it knows: it runs it and stops
                JobQueue(s, registry=reg).enqueue(echo, "bye")
                s.commit()
            worker.join(15)
    assert done == [1]
    assert len(_warnings(caplog)) >= 3 and set(_warnings(caplog)) == {EXPECTED}


def _ps(db_url: URL, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POSTJOB_DATABASE_URL", "DATABASE_URL")}
    return subprocess.run([POSTJOB, "--database-url", url_string(db_url), "ps", *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**env, "COLUMNS": str(columns)})


def _status_by_id(stdout: str) -> dict[int, str]:
    """The status column of a ps table (between the workflow and failed/max columns)."""
    lines = stdout.splitlines()
    start, end = lines[0].index("status"), lines[0].index("failed/max")
    return {int(line.split()[0]): line[start:end].strip() for line in lines[2:] if line[:1] == " "
            or line[:1].isdigit()}


def test_ps_marks_jobs_no_worker_runs_when_no_worker_is_running(db_url: URL, waiting: dict[str, int]) -> None:
    res = _ps(db_url)
    assert res.returncode == 0, res.stderr
    statuses = _status_by_id(res.stdout)
    assert statuses[waiting["ping"]] == "ready (no worker)"
    assert statuses[waiting["typo"]] == "err (no worker)"
    assert statuses[waiting["later"]] == "ready (no worker)"  # it will wait too, once due
    assert statuses[waiting["manual"]] == "awaits token"  # a person finishes it, not a worker
    assert statuses[waiting["gone"]] == "ok"
    assert res.stderr.splitlines()[0] == (  # a warning: on stderr, a line of its own
        "(no worker): no worker is running, so nothing runs these jobs; start one: postjob run "
        "--import MODULE")
    jobs = {j["id"]: j for j in json.loads(_ps(db_url, "--json").stdout)["jobs"]}
    marked = sorted(j["workflow"] for j in jobs.values() if j["no_worker"])
    assert marked == ["__main__.ping"] * 3 + [LONG_NAME, "app.typo", "later.job"]
    assert jobs[waiting["manual"]]["status"] == "ready"  # scripts get the raw status


def test_ps_marks_only_what_no_live_worker_knows(engine: Engine, db_url: URL, waiting: dict[str, int]) -> None:
    _live_worker(engine, "__main__.ping", "later.job", LONG_NAME)
    res = _ps(db_url)
    statuses = _status_by_id(res.stdout)
    assert statuses[waiting["ping"]] == "ready"
    assert statuses[waiting["typo"]] == "err (no worker)"
    assert res.stderr.splitlines()[0] == (
        "(no worker): none of the 1 running worker knows app.typo; start a worker that imports "
        "it (postjob run --import MODULE) or fix the name")
    res = _ps(db_url, "full", str(waiting["typo"]))
    assert "err (no worker)" in res.stdout and "none of the 1 running worker knows app.typo" in res.stderr


def test_ps_keeps_the_end_of_a_long_workflow_name(db_url: URL, waiting: dict[str, int]) -> None:
    res = _ps(db_url, columns=110)
    [line] = [ln for ln in res.stdout.splitlines() if ln.split()[:1] == [str(waiting["long"])]]
    shown = line.split()[1]
    assert shown.startswith("…") and shown.endswith(".send_monthly_invoice_reminder")
    assert len(shown) >= 24


def test_the_unknown_workflows_query_uses_the_waiting_jobs_indexes(
    engine: Engine, clean: None
) -> None:
    """Loose index scans: one probe per workflow, whatever the number of jobs."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO postjob.postjobs (workflow, status) "
            "SELECT 'wf' || (i % 20), CASE WHEN i % 2 = 0 THEN 'ready' ELSE 'ok' END::postjob.statuses "
            "FROM generate_series(1, 50000) i"))
        conn.execute(text("ANALYZE postjob.postjobs"))
        conn.execute(text("ANALYZE postjob.unfinished"))
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + _sql.WORKFLOWS_UNKNOWN).scalars())
    assert "Seq Scan on unfinished" not in plan and "Seq Scan on postjobs" not in plan, plan
    assert "unfinished_due_idx" in plan and "unfinished_scheduled_idx" in plan, plan
