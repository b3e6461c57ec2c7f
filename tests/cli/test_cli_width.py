"""`postjob ps full` and `postjob schedules` in a 100-column terminal, with long workflow names,
args, results and error messages (issue 38, item 10e): every column is there, each job or
schedule is one line that fits, a long workflow name keeps its end, an error message is cut
between words (never folded onto the next line), and the warnings go to stderr, each a line
of its own, never into the table."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text

from tests.cli.test_cli_db import POSTJOB
from tests.conftest import url_string

WIDTH = 100
PARENT = "acme.billing.invoices.run_the_whole_monthly_billing_cycle_for_all_customers"
CHILD = "acme.billing.invoices.generate_monthly_invoice_for_enterprise_customer"
NIGHTLY = "acme.reporting.nightly_warehouse_snapshot_and_consistency_check_of_everything"
MESSAGE = ("the payment provider refused the mandate of Another Customer With A Long Name GmbH "
           "because its reference expired on the first of the month")
CUSTOMER = '{"name": "Very Long Customer Name Incorporated International", "vat": "DE123456789"}'


def run(db_url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POSTJOB_DATABASE_URL", "DATABASE_URL")}
    return subprocess.run([POSTJOB, "--database-url", url_string(db_url), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**env, "COLUMNS": str(WIDTH)})


@pytest.fixture
def jobs(engine: Engine, clean: None) -> dict[str, int]:
    ins = text("INSERT INTO postjob.postjobs (parent_id, workflow, args, status, results, error, "
               "error_message, next_run_at) VALUES (:p, :w, CAST(:a AS jsonb), :s, "
               "CAST(:r AS jsonb), :e, :m, now()) RETURNING id")
    with engine.begin() as conn:
        def add(**kw: Any) -> int:
            return int(conn.execute(ins, {"p": None, "r": None, "e": None, "m": None, **kw}).scalar_one())

        root = add(w=PARENT, a=f"[[{CUSTOMER}, {CUSTOMER}]]", s="ready")
        ok = add(p=root, w=CHILD, a=f"[{CUSTOMER}, 0]", s="ok",
                 r='[{"invoice": "INV-2026-12-00000", "lines": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}]')
        failed = add(p=root, w=CHILD, a=f"[{CUSTOMER}, 1]", s="failed", e="MandateRefused",
                     m=MESSAGE)
        conn.execute(text(
            "INSERT INTO postjob.schedules (name, cron, timezone, skip_missed, last_run_at, "
            "last_job_id, next_tick_at) VALUES (:n, '15 3 * * *', 'America/Argentina/Buenos_Aires', "
            "false, now() - interval '5 minutes', :j, now() + interval '21 hours')"),
            {"n": NIGHTLY, "j": ok})
        conn.execute(text(
            "INSERT INTO postjob.schedules (name, every, skip_missed, next_tick_at) "
            "VALUES (:n, 90, true, now() + interval '30 seconds')"), {"n": CHILD})
    return {"root": root, "ok": ok, "failed": failed}


def test_ps_full_fits_100_columns_one_line_per_job(db_url: URL, jobs: dict[str, int]) -> None:
    res = run(db_url, "ps", "full", str(jobs["root"]))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(len(line) <= WIDTH for line in lines), "\n" + res.stdout
    assert lines[0].split() == ["job", "status", "failed/max", "result", "age"], res.stdout
    assert len(lines) == 2 + 3, "\n" + res.stdout  # header, rule, a line per job: nothing folded
    root, ok, failed = lines[2:]
    assert root.startswith(f"{jobs['root']} ") and "_for_all_customers" in root, root
    assert "ready (no worker)" in root and " 0/5 " in root
    assert f"└ {jobs['ok']} " in ok and "for_enterprise_customer" in ok and '{"lines":[1,2' in ok
    assert "failed" in failed and " 0/5 " in failed
    start = lines[0].index("result")
    shown = failed[start:].rsplit(None, 1)[0].strip()  # the result cell, the age after it
    assert shown.endswith("…") and len(shown) > 12, failed
    kept = shown[:-1].rstrip()
    assert MESSAGE.startswith(kept) and MESSAGE[len(kept)] == " ", f"a word was cut: {shown!r}"
    # the warning about the jobs no worker runs: on stderr, a line of its own
    assert "(no worker):" not in res.stdout
    assert [line for line in res.stderr.splitlines() if line.startswith("(no worker):")] == [
        "(no worker): no worker is running, so nothing runs these jobs; start one: postjob run "
        "--import MODULE"], res.stderr


def test_schedules_fit_100_columns_one_line_per_schedule(db_url: URL, jobs: dict[str, int]) -> None:
    res = run(db_url, "schedules")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(len(line) <= WIDTH for line in lines), "\n" + res.stdout
    header = lines[0]
    for column in ("workflow", "schedule", "missed", "last run", "job", "status", "next run"):
        assert column in header, (column, header)
    assert len(lines) == 2 + 2, "\n" + res.stdout
    interval, nightly = sorted(lines[2:], key=lambda line: "every" in line, reverse=True)
    assert "for_enterprise_customer" in interval and "every 1m30s" in interval and "skip" in interval
    assert "of_everything" in nightly and "15 3 * * *" in nightly and "Buenos_Aires" in nightly
    assert " latest " in nightly and f" {jobs['ok']} " in nightly and " ok " in nightly
    assert res.stderr == ""
