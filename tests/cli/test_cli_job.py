"""`postjob job …` through the installed script, against the real server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text

from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.conftest import end_by_hand, url_string

pytestmark = pytest.mark.both_drivers

FINGERPRINT = text(
    "SELECT md5(coalesce(string_agg(j::text, '|' ORDER BY id), '')) FROM postjob.jobs j"
)


@pytest.fixture
def cli(db_url: URL, clean: None) -> Any:
    url = url_string(db_url)
    return lambda *args: postjob(*args, url=url)


def _job(engine: Engine, job_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT *, status::text AS status FROM postjob.jobs WHERE id = :id"),
                           {"id": job_id}).mappings().one()
    return dict(row)


def _insert(engine: Engine) -> int:
    with engine.begin() as conn:
        return int(conn.execute(text("INSERT INTO postjob.postjobs (workflow) VALUES ('wf') "
                                     "RETURNING id")).scalar_one())


def _sql(engine: Engine, stmt: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(stmt), params)


def test_enqueue_with_every_option(cli: Any, engine: Engine) -> None:
    res = cli("job", "enqueue", "demo.report", '["a", "bb"]', "-1", '{"k": null}',
              "--queue", "reports", "--tags", "customer:42,kind:a:b", "--max-attempts", "3",
              "--timeout", "1h30m", "--run-at", "2030-01-31T12:00:00+00:00")
    assert res.returncode == 0, res.stderr
    job = _job(engine, int(res.stdout))
    assert job["args"] == [["a", "bb"], -1, {"k": None}]
    assert job["queue"] == "reports" and job["max_attempts"] == 3 and job["timeout"] == 5400
    assert job["tags"] == {"customer": "42", "kind": "a:b"}
    assert job["next_run_at"].isoformat() == "2030-01-31T12:00:00+00:00"


def test_enqueue_with_import_takes_the_workflow_defaults(cli: Any, engine: Engine) -> None:
    res = cli("job", "enqueue", "--import", "postjob_sa.demo", "demo.measure", '"word"')
    assert res.returncode == 0, res.stderr
    assert _job(engine, int(res.stdout))["max_attempts"] == 3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["job", "enqueue", "wf", "not-json"], "argument 1 is not JSON"),
        (["job", "enqueue", "wf", "--tags", "nocolon"], "malformed tags"),
        (["job", "enqueue", "wf", "--tags", ":v"], "malformed tags"),
        (["job", "enqueue", "wf", "--max-attempts", "0"], "max_attempts"),
        (["job", "enqueue", "wf", "--max-attempts", "x"], "not a valid integer"),
        (["job", "enqueue", "wf", "--timeout", "soon"], "not a timeout"),
        (["job", "enqueue", "wf", "--run-at", "tomorrow"], "not an ISO-8601 time"),
        (["job", "enqueue", "--import", "no.such.module", "wf"], "cannot import workflow module"),
        (["job", "enqueue", "--import", "postjob_sa.demo", "demo.nope"], "no workflow named"),
        # demo.measure(word): each run would fail with a TypeError, retried every attempt
        (["job", "enqueue", "--import", "postjob_sa.demo", "demo.measure"],
         "the args [] do not fit workflow 'demo.measure' (word): missing a required "
         "argument: 'word'"),
        (["job", "enqueue", "--import", "postjob_sa.demo", "demo.measure", '"a"', '"b"'],
         "too many positional arguments"),
        (["job", "reset", "999"], "no job has the id 999"),
        (["job", "reset", "1x"], "not a job id"),
        (["job", "force", "999"], "no job has the id 999"),
        (["job", "force", "--", "-3"], "not a job id"),
        (["job", "force", "-3"], "No such option"),
        (["job", "resolve", "not-a-token", "1"], "not a token"),
        (["job", "resolve", "00000000-0000-0000-0000-000000000000", "1"], "no job has the token"),
        (["job", "resolve", "00000000-0000-0000-0000-000000000000", "{oops"], "RESULT is not JSON"),
        (["job", "resolve", "00000000-0000-0000-0000-000000000000"], "RESULT"),
        (["job", "prune", "--older-than", "3 weeks"], "not a --older-than duration"),
        (["job", "prune", "--older-than", "300000000d"], "at most"),
        (["job", "enqueue", "wf", "--timeout", "300000000d"], "at most"),
        (["job", "prune", "--older-than", "1d", "--status", "ready"], "unknown status 'ready'"),
        (["job", "prune"], "--older-than"),
        (["job", "nosuchcommand"], "No such command"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    cli: Any, engine: Engine, args: list[str], needle: str
) -> None:
    _sql(engine, "INSERT INTO postjob.postjobs (workflow, status, tags) "
         "VALUES ('wf', 'ok', '{\"a\": 1}'), ('wf', 'ready', NULL)")
    with engine.connect() as conn:
        before = conn.execute(FINGERPRINT).scalar()
    assert_bad_input(cli(*args), needle)
    with engine.connect() as conn:
        assert conn.execute(FINGERPRINT).scalar() == before


def test_reset_and_force(cli: Any, engine: Engine) -> None:
    job_id = _insert(engine)
    _sql(engine, "UPDATE postjob.postjobs SET status = 'failed', failed_attempts = 5, "
         "error = 'E', next_run_at = NULL WHERE id = :id", id=job_id)
    assert_bad_input(cli("job", "force", str(job_id)), "only ready, err or sleep")
    res = cli("job", "reset", str(job_id))
    assert res.returncode == 0 and f"reset 1 job(s): {job_id}" in res.stdout
    job = _job(engine, job_id)
    assert (job["status"], job["failed_attempts"], job["error"]) == ("ready", 0, None)
    _sql(engine, "UPDATE postjob.postjobs SET next_run_at = now() + interval '1 day' WHERE id = :id",
         id=job_id)
    assert cli("job", "force", str(job_id)).returncode == 0
    with engine.connect() as conn:
        due = conn.execute(text("SELECT next_run_at <= now() FROM postjob.jobs WHERE id = :id"),
                           {"id": job_id}).scalar()
    assert due


def test_reset_of_a_job_whose_unique_key_a_newer_job_holds_is_bad_input(cli: Any, engine: Engine) -> None:
    """Issue 24 item 6: one line naming the holder, exit status 2 (was 1, "database error")."""
    with engine.begin() as conn:
        old = conn.execute(text("INSERT INTO postjob.postjobs (workflow, unique_key) "
                                "VALUES ('wf', 'nightly') RETURNING id")).scalar_one()
        end_by_hand(conn, old)
        newer = conn.execute(text("INSERT INTO postjob.postjobs (workflow, unique_key) "
                                  "VALUES ('wf', 'nightly') RETURNING id")).scalar_one()
    with engine.connect() as conn:
        before = conn.execute(FINGERPRINT).scalar()
    assert_bad_input(cli("job", "reset", str(old)),
                     f"job {old} cannot be reset", f"held by unfinished job {newer}")
    with engine.connect() as conn:
        assert conn.execute(FINGERPRINT).scalar() == before


def _manual_child(cli: Any, engine: Engine) -> tuple[int, int, str]:
    parent = _insert(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE postjob.postjobs SET status = 'sleep' WHERE id = :id"), {"id": parent})
        conn.execute(text("UPDATE postjob.unfinished SET status = 'sleep', run_at = NULL, due = false "
                          "WHERE job_id = :id"), {"id": parent})  # asleep, as its run leaves it
        child = conn.execute(text("INSERT INTO postjob.postjobs (parent_id, workflow, args, max_attempts) "
                                  "VALUES (:p, '__manual__', '[\"ok?\"]', 1) RETURNING id"),
                             {"p": parent}).scalar_one()
        conn.execute(text("UPDATE postjob.postjobs SET awaiting_id = :c WHERE id = :p"),
                     {"c": child, "p": parent})
        token = conn.execute(text("SELECT postjob.manual_token(:id)::text"), {"id": child}).scalar_one()
    return parent, child, token


def test_resolve_wakes_the_parent_and_refuses_a_final_job(cli: Any, engine: Engine) -> None:
    parent, child, token = _manual_child(cli, engine)
    res = cli("job", "resolve", token, '{"approved": true}')
    assert res.returncode == 0 and f"job {child} resolved" in res.stdout
    assert _job(engine, child)["results"] == [{"approved": True}]
    assert _job(engine, parent)["status"] == "ready"
    assert_bad_input(cli("job", "resolve", token, "1"), f"job {child} is already ok")

    _, child2, token2 = _manual_child(cli, engine)
    res = cli("job", "resolve", token2, "--error", "rejected by Bob")
    assert res.returncode == 0 and f"job {child2} failed" in res.stdout
    assert _job(engine, child2)["error_message"] == "rejected by Bob"


def test_resolve_of_a_job_that_is_not_manual(cli: Any, engine: Engine) -> None:
    job_id = _insert(engine)
    with engine.begin() as conn:
        token = conn.execute(text("SELECT postjob.manual_token(:id)::text"), {"id": job_id}).scalar_one()
    assert_bad_input(cli("job", "resolve", token, "1"), "not a manual job")
    assert _job(engine, job_id)["status"] == "ready"


def test_prune_deletes_old_final_trees_in_batches(cli: Any, engine: Engine) -> None:
    ids = [_insert(engine) for _ in range(4)]
    with engine.begin() as conn:
        for root in ids:
            conn.execute(text("INSERT INTO postjob.postjobs (parent_id, workflow, status) "
                              "VALUES (:p, 'child', 'ok')"), {"p": root})
        conn.execute(text("UPDATE postjob.postjobs SET status = 'ok', "
                          "updated_at = now() - interval '3 days'"))
        # ids[1] failed; ids[2] has an unfinished child; ids[3] is recent
        conn.execute(text("UPDATE postjob.postjobs SET status = 'failed' WHERE id = :id"), {"id": ids[1]})
        conn.execute(text("UPDATE postjob.postjobs SET status = 'err' WHERE parent_id = :id"), {"id": ids[2]})
        conn.execute(text("UPDATE postjob.postjobs SET updated_at = now() WHERE id = :id"), {"id": ids[3]})

    res = cli("job", "prune", "--older-than", "2d", "--dry-run")
    assert res.returncode == 0 and "would delete 2 root job(s), 4 job(s) in all" in res.stdout
    res = cli("job", "prune", "--older-than", "2d", "--status", "ok")
    assert res.returncode == 0 and "deleted 1 root job(s), 2 job(s) in all" in res.stdout
    res = cli("job", "prune", "--older-than", "48h", "--batch", "1")
    assert res.returncode == 0 and "deleted 1 root job(s), 2 job(s) in all" in res.stdout
    with engine.connect() as conn:
        left = sorted(r[0] for r in conn.execute(text("SELECT root_id FROM postjob.jobs")))
    assert left == sorted([ids[2], ids[2], ids[3], ids[3]])
    assert json.loads(cli("ps", "--json").stdout)["jobs"][0]["id"] == ids[3]


def test_prune_deletes_a_finished_tree_with_a_cancelled_child(cli: Any, engine: Engine) -> None:
    """'cancelled' is final too: a tree whose child was cancelled is finished (it was never
    pruned: the check for unfinished descendants left 'cancelled' out)."""
    root = _insert(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO postjob.postjobs (parent_id, workflow, status) "
                          "VALUES (:p, 'child', 'cancelled')"), {"p": root})
        conn.execute(text("UPDATE postjob.postjobs SET status = 'ok', "
                          "updated_at = now() - interval '3 days' WHERE id = :r"), {"r": root})
        conn.execute(text("UPDATE postjob.postjobs SET updated_at = now() - interval '3 days'"))
    res = cli("job", "prune", "--older-than", "2d")
    assert res.returncode == 0 and "deleted 1 root job(s), 2 job(s) in all" in res.stdout


def _live_worker(engine: Engine, *workflows: str) -> None:
    _sql(engine, "INSERT INTO postjob.workers (identifier, expires_at, code_revision, workflows) "
         "VALUES ('host:1', now() + interval '1 hour', 'pj0008', CAST(:w AS text[]))",
         w=list(workflows))


def test_enqueue_of_a_name_no_running_worker_knows_says_so(cli: Any, engine: Engine) -> None:
    """A typo, or a workflow stored under __main__.name: the job would wait for ever."""
    _live_worker(engine, "demo.measure")
    res = cli("job", "enqueue", "demo.mesure", '"word"', "--max-attempts", "3", "--queue", "q",
              "--timeout", "1m")
    assert res.returncode == 0, res.stderr
    assert _job(engine, int(res.stdout))["workflow"] == "demo.mesure"
    assert res.stderr.splitlines() == [
        "postjob: note: no running worker knows a workflow named 'demo.mesure' (running "
        "workers know demo.measure): check the name; the job waits until a worker that "
        "imports it starts (postjob run --import MODULE)"]
    _sql(engine, "TRUNCATE postjob.workers")
    res = cli("job", "enqueue", "demo.mesure", '"word"', "--max-attempts", "3", "--queue", "q",
              "--timeout", "1m")
    assert res.stderr.splitlines() == [
        "postjob: note: no running worker knows a workflow named 'demo.mesure' (no worker "
        "is running): check the name; the job waits until a worker that imports it starts "
        "(postjob run --import MODULE)"]


def test_enqueue_without_import_says_the_workflow_defaults_do_not_apply(cli: Any, engine: Engine) -> None:
    _live_worker(engine, "demo.measure", "demo.report")
    res = cli("job", "enqueue", "demo.measure", '"word"')
    assert res.returncode == 0, res.stderr
    job = _job(engine, int(res.stdout))
    assert (job["queue"], job["max_attempts"], job["timeout"]) == ("q", 5, None)  # not demo's 3
    assert res.stderr.splitlines() == [
        "postjob: warning: demo.measure is not imported here, so the job has the table's "
        "defaults, not its @postjob_sa.workflow options: queue 'q', max_attempts 5, no "
        "timeout (--import MODULE uses the workflow's own)"]
    res = cli("job", "enqueue", "demo.measure", '"word"', "--max-attempts", "3", "--queue", "q")
    assert res.stderr.splitlines() == [
        "postjob: warning: demo.measure is not imported here, so the job has the table's "
        "defaults, not its @postjob_sa.workflow options: no timeout (--import MODULE uses "
        "the workflow's own)"]
    res = cli("job", "enqueue", "demo.measure", '"word"', "--import", "postjob_sa.demo")
    assert res.returncode == 0 and res.stderr == ""
    help_text = " ".join(cli("job", "enqueue", "--help").stdout.split())
    assert ("Without --import, the options of the workflow's @postjob_sa.workflow(...) are not "
            "known: the job gets the options given here, else the table's defaults, queue q, "
            "5 attempts and no timeout") in help_text
