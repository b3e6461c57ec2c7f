"""`postjob job enqueue` and the options a workflow declares (issue 38, item 10a).

A job's queue, max_attempts and timeout are written when it is enqueued, from the options
given, else the workflow's ``@postjob_sa.workflow(...)``, else the table's defaults. The
command finds the workflow's own where this process has it (``--import``, or a host that
imported its workflows before calling ``postjob_sa.cli.main``); elsewhere it enqueues with
the table's defaults and says so in one warning line on stderr that names ``--import``."""

from __future__ import annotations

import pytest
from sqlalchemy import URL, Engine, text

import postjob_sa
from postjob_sa.cli import main
from tests.cli.test_cli_db import postjob
from tests.conftest import url_string


@postjob_sa.workflow(name="tests.cli.declared", max_attempts=3, timeout=300, queue="reports")
def declared(word: str) -> str:
    return word


def _options(engine: Engine, job_id: int) -> tuple[str, int, float | None]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT queue, max_attempts, timeout FROM postjob.jobs "
                                "WHERE id = :id"), {"id": job_id}).one()
    return row.queue, row.max_attempts, row.timeout


def test_without_import_one_warning_line_names_the_table_defaults_and_import(
        db_url: URL, engine: Engine, clean: None) -> None:
    url = url_string(db_url)
    res = postjob("job", "enqueue", "demo.measure", '"word"', url=url)
    assert res.returncode == 0, res.stderr
    assert _options(engine, int(res.stdout)) == ("q", 5, None)  # not demo.measure's 3 attempts
    warning = [line for line in res.stderr.splitlines() if "warning" in line]
    assert warning == [
        "postjob: warning: demo.measure is not imported here, so the job has the table's "
        "defaults, not its @postjob_sa.workflow options: queue 'q', max_attempts 5, no "
        "timeout (--import MODULE uses the workflow's own)"], res.stderr
    # what was given is not the table's: only the rest is named
    res = postjob("job", "enqueue", "demo.measure", '"word"', "--max-attempts", "3",
                  "--queue", "q", url=url)
    assert [line for line in res.stderr.splitlines() if "warning" in line] == [
        "postjob: warning: demo.measure is not imported here, so the job has the table's "
        "defaults, not its @postjob_sa.workflow options: no timeout (--import MODULE uses "
        "the workflow's own)"]
    res = postjob("job", "enqueue", "demo.measure", '"word"', "--max-attempts", "3",
                  "--queue", "q", "--timeout", "5m", url=url)
    assert "warning" not in res.stderr


def test_a_workflow_this_process_has_keeps_its_declared_options(
        db_url: URL, engine: Engine, clean: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A host that imported its workflows and calls the CLI in its own process (a management
    command) needs no --import: the job gets 3 attempts, 300 s and queue reports."""

    def run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as stopped:
            main(["--database-url", url_string(db_url), *argv])
        out = capsys.readouterr()
        return int(stopped.value.code or 0), out.out, out.err

    code, out, err = run("job", "enqueue", "tests.cli.declared", '"word"')
    assert code == 0, err
    assert _options(engine, int(out)) == ("reports", 3, 300.0)
    assert "warning" not in err and "not imported" not in err
    code, out, err = run("job", "enqueue", "tests.cli.declared", '"word"', "--max-attempts", "7")
    assert _options(engine, int(out)) == ("reports", 7, 300.0)
    # the process has its function, so the args are checked as with --import
    code, out, err = run("job", "enqueue", "tests.cli.declared", "1", "2")
    assert code == 2 and out == "" and "do not fit workflow 'tests.cli.declared'" in err
