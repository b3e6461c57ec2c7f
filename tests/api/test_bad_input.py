"""The bad-input catalogue of docs/operations.md, the rows other modules do not already
cover: each is refused with its error class (API) or one ``postjob:`` line and exit status 2
(CLI), and nothing is written. SQL metacharacters in every CLI filter are values, never SQL."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, InvalidJobState, JobNotFound, JobQueue
from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.cli.test_cli_job import FINGERPRINT
from tests.conftest import url_string

pytestmark = pytest.mark.both_drivers

EVIL = "x'; DROP TABLE postjob.postjobs; --"


@pytest.fixture
def seeded(engine: Engine, clean: None) -> dict[str, Any]:
    """An ok job, a ready job, a manual job (with its token) and an ok manual job."""
    with engine.begin() as conn:
        ids = [r[0] for r in conn.execute(text(
            "INSERT INTO postjob.postjobs (workflow, status, tags, queue) VALUES "
            "('wf', 'ok', '{\"a\": \"1\"}', 'q'), ('wf', 'ready', NULL, 'q'), "
            "('__manual__', 'ready', NULL, 'q'), ('__manual__', 'ok', NULL, 'q') RETURNING id"))]
        tokens = [conn.execute(text("SELECT postjob.manual_token(:i)::text"), {"i": i}).scalar_one()
                  for i in ids[2:]]
    return {"ok": ids[0], "ready": ids[1], "open_token": tokens[0], "final_token": tokens[1]}


def _fingerprint(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(FINGERPRINT).scalar(), conn.execute(
            text("SELECT md5(string_agg(t::text, '|' ORDER BY id)) FROM postjob.tokens t")).scalar()


class NotJSON:
    pass


API_CASES = [
    ("force a final job", lambda q, s: q.force(s["ok"]), InvalidJobState, "only ready, err or sleep"),
    ("force an unknown job", lambda q, s: q.force(10**9), JobNotFound, "no job has the id"),
    ("reset an unknown job", lambda q, s: q.reset(s["ready"], 10**9), JobNotFound, "no job"),
    ("reset an absurd id", lambda q, s: q.reset(1 << 63), InvalidArgument, "out of range"),
    ("resolve a final job", lambda q, s: q.resolve(s["final_token"], 1), InvalidJobState, "already ok"),
    ("resolve an unknown token",
     lambda q, s: q.resolve("00000000-0000-0000-0000-000000000000", 1), JobNotFound, "token"),
    ("resolve a malformed token", lambda q, s: q.resolve(EVIL, 1), InvalidArgument, "not a token"),
    ("resolve with a non-JSON result",
     lambda q, s: q.resolve(s["open_token"], NotJSON()), InvalidArgument, "JSON"),
    ("resolve with a NaN result",
     lambda q, s: q.resolve(s["open_token"], float("nan")), InvalidArgument, "JSON"),
    ("resolve with a NUL in the error message",
     lambda q, s: q.resolve(s["open_token"], error="not\x00approved"), InvalidArgument, "NUL"),
    ("resolve with a lone surrogate in the error message",
     lambda q, s: q.resolve(s["open_token"], error="not " + os.fsdecode(b"\xff")),
     InvalidArgument, "lone surrogate"),
    ("enqueue a non-JSON arg", lambda q, s: q.enqueue("wf", {1, 2}), InvalidArgument, "JSON"),
    ("enqueue malformed tags", lambda q, s: q.enqueue("wf", tags={"": "x"}), InvalidArgument, "tag"),
    ("enqueue with max_attempts -1",
     lambda q, s: q.enqueue("wf", max_attempts=-1), InvalidArgument, "max_attempts"),
    ("enqueue with timeout 0", lambda q, s: q.enqueue("wf", timeout=0), InvalidArgument, "timeout"),
    ("a worker with a negative lease",
     lambda q, s: JobQueue(q.session, lease=-1), InvalidArgument, "lease"),
    ("work with count 0", lambda q, s: q.work(count=0), InvalidArgument, "count"),
]


@pytest.mark.parametrize(("case", "call", "error", "needle"), API_CASES,
                         ids=[c[0] for c in API_CASES])
def test_api_refuses_and_writes_nothing(
    engine: Engine, seeded: dict[str, Any], case: str, call: Any, error: type, needle: str
) -> None:
    before = _fingerprint(engine)
    with Session(engine) as s:
        with pytest.raises(error, match=needle):
            call(JobQueue(s), seeded)
        s.commit()  # whatever the refused call might have left in the transaction
    assert _fingerprint(engine) == before


def test_a_workflow_result_that_is_not_json_fails_the_job_not_the_worker(
    engine: Engine, clean: None
) -> None:
    reg = postjob_sa.Registry()
    postjob_sa.workflow(name="bad.result", registry=reg)(lambda: NotJSON())
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        job = q.enqueue("bad.result")
        s.commit()
        assert q.drain() == 1
        s.refresh(job)
        assert job.status.value == "failed" and job.results is None
        assert "not JSON" in (job.error_message or "")


@pytest.fixture
def cli(db_url: URL, seeded: dict[str, Any]) -> Any:
    url = url_string(db_url)
    return lambda *args: postjob(*args, url=url)


def _cli_cases() -> list[tuple[list[str], str]]:
    big = ["\"" + "x" * 110_000 + "\""] * 10  # over 1 MiB of JSON args, each under ARG_MAX's cap
    return [
        (["job", "enqueue", "wf", *big], "the limit is 1048576"),
        (["job", "enqueue", "wf", "[1, 2"], "argument 1 is not JSON"),
        (["job", "enqueue", "wf", "NaN"], "not JSON"),
        # an option misspelt: named as the unknown option it is (JSON args may start with -)
        (["job", "enqueue", "wf", "1", "--priorty", "3"],
         "No such option '--priorty'. (Did you mean one of: '--import', '--priority'?)"),
        (["job", "enqueue", "wf", "--queu=q"], "No such option '--queu'"),
        (["job", "enqueue", "wf", "--tags", "a:1,a:2"], "given twice"),
        (["job", "enqueue", "wf", "--timeout=-5"], "more than 0 seconds"),
        (["job", "enqueue", "wf", "--timeout", "0"], "more than 0"),
        (["job", "enqueue", "wf", "--timeout", "1000d"], "at most"),
        (["job", "enqueue", "wf", "--max-attempts=-1"], "max_attempts"),
        (["job", "enqueue", "wf", "--max-attempts", "100000"], "max_attempts"),
        (["job", "enqueue", "wf", "--max-attempts", "99999999999999999999"], "max_attempts"),
        (["job", "enqueue", "", "1"], "workflow"),
        (["job", "force", "{ok}"], "only ready, err or sleep"),
        (["job", "reset", "9223372036854775808"], "out of range"),
        (["job", "resolve", "{final_token}", "1"], "already ok"),
        (["job", "resolve", "{open_token}", "--error", "x", "1"], "not both"),
        # an argument's undecodable byte arrives as a lone surrogate (os.fsdecode)
        (["job", "resolve", "{open_token}", "--error", "no " + os.fsdecode(b"\xff")], "lone surrogate"),
        (["run", "--import", "postjob_sa.demo", "--lease=-1"], "--lease duration must be more than 0"),
        (["run", "--import", "postjob_sa.demo", "--count", "0"], "--count"),
        (["ps", "--limit=-1"], "--limit"),
        (["ps", "top", "--interval", "0"], "--interval"),
        (["job", "prune", "--older-than", "1d", "--batch", "0"], "--batch"),
        # SQL metacharacters in the filters that validate their values
        (["ps", "--status", EVIL], "unknown status"),
        (["ps", "show", EVIL], "not a job id"),
        (["ps", "full", "1;DROP"], "not a job id"),
        (["ps", "--tags", EVIL.replace(":", "")], "malformed tags"),
        (["job", "prune", "--older-than", "1d", "--status", EVIL], "unknown status"),
        (["job", "prune", "--older-than", "1d; DROP TABLE postjob.postjobs"], "not a --older-than"),
        (["job", "resolve", EVIL, "1"], "not a token"),
        (["job", "reset", EVIL], "not a job id"),
        (["db", "grant", EVIL], "no role named"),
    ]


CLI_CASES = _cli_cases()


@pytest.mark.parametrize(("args", "needle"), CLI_CASES,
                         ids=[" ".join(a[:3])[:60] for a, _ in CLI_CASES])
def test_cli_refuses_with_one_line_exit_2_and_writes_nothing(
    cli: Any, engine: Engine, seeded: dict[str, Any], args: list[str], needle: str
) -> None:
    before = _fingerprint(engine)
    assert_bad_input(cli(*[a.format(**seeded) if a.startswith("{") else a for a in args]), needle)
    assert _fingerprint(engine) == before


def test_sql_metacharacters_in_value_filters_are_values(cli: Any, engine: Engine) -> None:
    """Filters that take any text bind it: it matches nothing or exactly itself."""
    res = cli("ps", "--json", "--tags", f"k:{EVIL}")
    assert res.returncode == 0 and json.loads(res.stdout)["jobs"] == []
    res = cli("ps", "top", "--iterations", "1", "--tags", f"k:{EVIL}")
    assert res.returncode == 0 and "no jobs" in res.stdout
    # a queue name is a value: stored verbatim, and a worker of that queue runs exactly it
    res = cli("job", "enqueue", "demo.measure", '"abc"', "--queue", EVIL, "--tags", f"k:{EVIL}")
    assert res.returncode == 0, res.stderr
    job_id = int(res.stdout)
    res = cli("run", "--import", "postjob_sa.demo", "--queue", EVIL, "--count", "1", "--fast")
    assert res.returncode == 0, res.stderr
    with engine.connect() as conn:
        row = conn.execute(text("SELECT queue, tags, status::text FROM postjob.jobs "
                                "WHERE id = :i"), {"i": job_id}).one()
        assert row == (EVIL, {"k": EVIL}, "ok")
        assert conn.execute(text("SELECT count(*) FROM postjob.jobs")).scalar() == 5
    res = cli("ps", "--json", "--tags", f"k:{EVIL}")
    assert [j["id"] for j in json.loads(res.stdout)["jobs"]] == [job_id]
