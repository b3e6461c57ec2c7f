"""`postjob ps …` through the installed script, against the real server."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text

from tests.cli.test_cli_db import POSTJOB, assert_bad_input, postjob
from tests.conftest import url_string
from tests.reliability.conftest import wait_for

pytestmark = pytest.mark.both_drivers


@pytest.fixture(scope="module")
def tree(db_url: URL, engine: Engine) -> dict[str, int]:
    """Root jobs (a finished tree, a failed one, a processing one) inserted once."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE postjob.postjobs, postjob.tokens RESTART IDENTITY CASCADE"))
        ins = text("INSERT INTO postjob.postjobs (parent_id, workflow, workflow_version, args, status, "
                   "results, error, error_message, tags, next_run_at) VALUES (:p, :w, :v, "
                   "CAST(:a AS jsonb), :s, CAST(:r AS jsonb), :e, :m, CAST(:t AS jsonb), now()) RETURNING id")

        def add(**kw: Any) -> int:
            row = {"p": None, "v": "", "a": "[]", "r": None, "e": None, "m": None, "t": None, **kw}
            return int(conn.execute(ins, row).scalar_one())

        root = add(w="report", v="2", s="ok", r='[{"total": 3}]', t='{"customer": "42", "x": "y"}')
        child = add(p=root, w="measure", a='["abc"]', s="ok", r="[3]")
        add(p=child, w="grandchild", s="ok", r='["deep"]')
        failed = add(w="report", s="failed", e="ValueError", m="boom", t='{"customer": "7"}')
        busy = add(w="slow", s="ready")
        # checked out through the API by host:123 (the record names the holder, the job's
        # row in postjob.unfinished has the lease)
        conn.execute(text(
            "UPDATE postjob.postjobs SET processing_started_at = now(), "
            "processing_max_duration = 60, processing_client = '10.0.0.1:5000', "
            "processing_client_identifier = 'host:123' WHERE id = :id"), {"id": busy})
        conn.execute(text(
            "UPDATE postjob.unfinished SET lease_token = nextval('postjob.lease_tokens'), "
            "lease_expires_at = now() + interval '60 seconds', started_at = now(), "
            "holder = 'host:123' WHERE job_id = :id"), {"id": busy})
    return {"root": root, "child": child, "failed": failed, "busy": busy}


@pytest.fixture(scope="module")
def cli(db_url: URL, tree: dict[str, int]) -> Any:
    url = url_string(db_url)
    return lambda *args: postjob(*args, url=url)


def test_ps_lists_root_jobs_newest_first(cli: Any, tree: dict[str, int]) -> None:
    res = cli("ps")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    # attempts: the failed ones of the most a job has (0/5 for a job that never failed)
    assert lines[0].split() == ["id", "workflow", "status", "failed/max", "result",
                                "next_run_in", "age", "processing", "worker", "tags"]
    ids = [int(line.split()[0]) for line in lines[2:]]
    assert ids == [tree["busy"], tree["failed"], tree["root"]]
    busy = lines[2]
    assert "processing" in busy and "/1m00s" in busy and "10.0.0.1:5000/host:123" in busy
    assert "boom" in lines[3] and "report@2" in lines[4] and '{"total":3}' in lines[4]
    assert "customer:42,x:y" in lines[4]


def test_ps_json_filters_and_limit(cli: Any, tree: dict[str, int]) -> None:
    out = json.loads(cli("ps", "--json", "--tags", "customer:42").stdout)
    assert [j["id"] for j in out["jobs"]] == [tree["root"]] and out["more"] is False
    assert out["jobs"][0]["result"] == {"total": 3}
    out = json.loads(cli("ps", "--json", "--status", "failed,processing").stdout)
    assert [j["id"] for j in out["jobs"]] == [tree["busy"], tree["failed"]]
    res = cli("ps", "--limit", "1")
    assert "more than 1 jobs match" in res.stdout
    out = json.loads(cli("ps", "--json", "--limit", "1").stdout)
    assert len(out["jobs"]) == 1 and out["more"] is True


def test_tag_filter_with_sql_metacharacters_is_just_a_value(cli: Any, engine: Engine) -> None:
    res = cli("ps", "--json", "--tags", "x:'; DROP TABLE postjob.postjobs; --")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["jobs"] == []
    res = cli("ps", "--tags", "x\":1}'::jsonb OR true --:y")
    assert res.returncode == 0 and "no jobs" in res.stdout
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM postjob.jobs")).scalar() == 5


def test_ps_with_ids_shows_their_trees(cli: Any, tree: dict[str, int]) -> None:
    res = cli("ps", str(tree["child"]))
    ids = [line.split()[0] for line in res.stdout.splitlines()[2:]]
    assert ids == [f"{tree['root']}.{tree['child']}", f"{tree['root']}.{tree['child']}.{tree['child'] + 1}"]


def test_ps_full_draws_the_tree_with_results(cli: Any, tree: dict[str, int]) -> None:
    res = cli("ps", "full", str(tree["root"]))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].split() == ["job", "status", "failed/max", "result", "age"]
    lines = res.stdout.splitlines()[2:]
    assert lines[0].startswith(f"{tree['root']} report@2") and '{"total":3}' in lines[0]
    assert lines[1].startswith(f"  └ {tree['child']} measure") and " 3 " in lines[1]
    assert lines[2].startswith("    └ ") and '"deep"' in lines[2]
    out = json.loads(cli("ps", "full", "--json", str(tree["root"])).stdout)
    assert [len(t) for t in out] == [3]


def test_ps_show_prints_every_field(cli: Any, tree: dict[str, int]) -> None:
    res = cli("ps", "show", str(tree["failed"]), str(tree["root"]))
    assert res.returncode == 0, res.stderr
    for field in ("parent_id", "error_message", "processing_client_identifier", "lease_token", "token"):
        assert field in res.stdout
    assert res.stdout.index(f"job {tree['failed']}") < res.stdout.index(f"job {tree['root']}")
    out = json.loads(cli("ps", "show", "--json", str(tree["failed"])).stdout)
    assert out[0]["error_message"] == "boom" and out[0]["status"] == "failed"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ps", "999"], "no job has the id 999"),
        (["ps", "show", "1", "998", "999"], "no job has the ids 998, 999"),
        (["ps", "full", "abc"], "not a job id"),
        (["ps", "--tags", "customer"], "malformed tags"),
        (["ps", "--status", "done"], "unknown status 'done'"),
        (["ps", "--limit", "0"], "--limit"),
        (["ps", "show"], "Missing argument"),
    ],
)
def test_ps_bad_input(cli: Any, args: list[str], needle: str) -> None:
    assert_bad_input(cli(*args), needle)


#: When the idle connection of a `postjob ps top` last ran a statement (None: not connected).
TOP_LAST_QUERY = text("SELECT max(query_start) FROM pg_stat_activity WHERE datname = "
                      "current_database() AND application_name = 'postjob' AND state = 'idle'")


#: ... and when one of them waits for a lock.
TOP_WAITING = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                   "AND application_name = 'postjob' AND wait_event_type = 'Lock'")


@contextlib.contextmanager
def top(url: str) -> Iterator[subprocess.Popen[bytes]]:
    """A `postjob ps top` refreshing every 0.2 s, stdin not a terminal (and at EOF); killed and
    its pipes closed if the test leaves it running."""
    proc = subprocess.Popen([POSTJOB, "--database-url", url, "ps", "top", "--interval", "0.2"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_for_refreshes(engine: Engine, proc: subprocess.Popen[bytes], n: int) -> None:
    """Until the idle connection of ``proc`` has run a statement n times (Ctrl-C before that
    would land in its imports, where it is an interruption)."""
    with engine.connect() as conn:
        seen: list[object] = []

        def refreshed() -> bool:
            assert proc.poll() is None, proc.communicate()
            last = conn.execute(TOP_LAST_QUERY).scalar()
            conn.rollback()  # a fresh snapshot of pg_stat_activity each time
            if last is not None and last not in seen:
                seen.append(last)
            return len(seen) >= n

        wait_for(refreshed, 60, f"{n} refreshes of ps top", interval=0.05)


def test_ps_top_refreshes_and_stops_without_a_terminal(
    db_url: URL, engine: Engine, tree: dict[str, int]
) -> None:
    url = url_string(db_url)
    res = postjob("ps", "top", "--iterations", "2", "--interval", "0.2", url=url)
    assert res.returncode == 0, res.stderr
    assert "postjob top" in res.stdout and "report@2" in res.stdout
    # stdin is not a terminal (and at EOF): it keeps refreshing until Ctrl-C, without spinning
    with top(url) as proc:
        wait_for_refreshes(engine, proc, 2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert b"postjob top" in out


def test_ps_top_ends_the_refresh_under_way_before_ctrl_c_stops_it(
    db_url: URL, engine: Engine, tree: dict[str, int]
) -> None:
    """Ctrl-C inside the driver or the connection pool could leave the pool's lock held or the
    connection mid-statement (an exit that hangs): during a refresh it stops ps top when the
    refresh has ended. A second Ctrl-C interrupts the refresh (psycopg; psycopg2 cannot)."""
    url = url_string(db_url)
    # psycopg2 runs Python's handler only once libpq returns: its blocked query ends first
    for presses in (1, 2) if engine.dialect.driver == "psycopg" else (1,):
        with top(url) as proc:
            wait_for_refreshes(engine, proc, 1)
            with engine.connect() as locker:  # the next refresh waits for the jobs' tables
                locker.execute(text("LOCK TABLE postjob.postjobs, postjob.unfinished "
                                    "IN ACCESS EXCLUSIVE MODE"))
                with engine.connect() as conn:

                    def waiting() -> bool:
                        found = conn.execute(TOP_WAITING).scalar() == 1
                        conn.rollback()
                        return found

                    wait_for(waiting, 60, "a refresh waiting for the lock", interval=0.05)
                for _ in range(presses):
                    proc.send_signal(signal.SIGINT)
                    time.sleep(0.3)
                if presses == 1:
                    time.sleep(1.0)
                    assert proc.poll() is None, "Ctrl-C interrupted the refresh under way"
                    locker.rollback()  # the refresh ends, then ps top does
                out, err = proc.communicate(timeout=30)
                locker.rollback()
            assert proc.returncode == 0, err
            if presses == 1:  # two may interrupt the first frame, before anything is drawn
                assert b"postjob top" in out

