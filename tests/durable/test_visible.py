"""What durable calls stored is visible: ``postjob ps show`` lists a job's steps (name, when,
result or error), the time it sleeps until and the events it waits for (``--json`` too), and
so does the dashboard's job page."""

from __future__ import annotations

import json
import time

from sqlalchemy import Engine
from sqlalchemy.orm import Session
from werkzeug.test import Client

from postjob_sa import JobQueue
from postjob_sa.web import create_app
from tests.cli.test_cli_db import postjob
from tests.conftest import url_string
from tests.durable import durable_app


def _jobs(engine: Engine) -> tuple[int, int]:
    """A job asleep after a step, and one waiting for an event with a deadline."""
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True)
        napping = q.enqueue(durable_app.nap, 3600).id
        waiting = q.enqueue(durable_app.waiter, "parcel:<b>9</b>", 600).id
        s.commit()
        q.drain()
    return napping, waiting


def test_ps_show_lists_steps_sleeps_and_waits(side: Engine) -> None:
    napping, waiting = _jobs(side)
    url = url_string(side.url)
    res = postjob("ps", "show", str(napping), str(waiting), url=url)
    assert res.returncode == 0, res.stderr
    first, second = res.stdout.split(f"job {waiting}")
    assert "step before: 1" in first and "sleep #1: until " in first and "sleeps_until" in first
    assert "parcel:<b>9</b> (until " in second
    out = json.loads(postjob("ps", "show", "--json", str(napping), str(waiting), url=url).stdout)
    assert [s["kind"] for s in out[0]["steps"]] == ["step", "sleep"]
    assert out[0]["steps"][0]["result"] == 1 and out[0]["sleeps_until"] is not None
    assert out[1]["steps"] == [] and out[1]["waits_for_events"][0]["key"] == "parcel:<b>9</b>"


def test_the_job_page_lists_them_too(side: Engine) -> None:
    napping, waiting = _jobs(side)
    client = Client(create_app(side))
    page = client.get(f"/jobs/{napping}").get_data(as_text=True)
    assert "Durable steps" in page and "Sleeps until" in page
    assert "<th scope=\"row\">before</th>" in page and "<code>1</code>" in page
    assert "sleep #1" in page
    other = client.get(f"/jobs/{waiting}").get_data(as_text=True)
    assert "Waits for the event <code>parcel:&lt;b&gt;9&lt;/b&gt;</code>" in other  # escaped


def test_ps_shows_a_job_woken_by_an_event_as_due_not_at_its_old_timeout(side: Engine) -> None:
    with Session(side) as s:
        q = JobQueue(s, fast_mode=True)
        job_id = q.enqueue(durable_app.waiter, "parcel:1", 3600).id
        s.commit()
        q.drain()
    url = url_string(side.url)

    def shown() -> tuple[float, str]:
        out = json.loads(postjob("ps", "--json", url=url).stdout)["jobs"]
        table = postjob("ps", url=url).stdout.splitlines()
        (row,) = [line for line in table if line.split()[0] == str(job_id)]
        header = table[0].split()
        return out[0]["next_run_in"], row.split()[header.index("next_run_in")]

    waits, _ = shown()
    assert 3500 < waits <= 3600  # until the event's timeout
    emitted = time.monotonic()
    with Session(side) as s:  # the event comes: the job is due now
        JobQueue(s).emit_event("parcel:1", {"tracking": "1Z"})
        s.commit()
    due, column = shown()
    # due since the emit: overdue by at most the time ps took to start and answer (seconds on
    # a loaded machine), never waiting for the old timeout
    assert -(time.monotonic() - emitted) - 1 < due <= 0, due
    assert column == "0s" or column.startswith("-"), column
