"""``postjob event emit KEY [PAYLOAD]`` wakes the jobs waiting for KEY; ``postjob event prune``
deletes old events; bad input is one line and exit status 2."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.conftest import url_string
from tests.durable import durable_app

pytestmark = pytest.mark.both_drivers


@pytest.fixture
def cli(db_url: URL, clean: None) -> Any:
    url = url_string(db_url)
    return lambda *args: postjob(*args, url=url)


def test_emit_wakes_the_waiter_with_the_payload(cli: Any, engine: Engine) -> None:
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True)
        job_id = q.enqueue(durable_app.waiter_async, "parcel:7").id
        s.commit()
        q.drain()
        res = cli("event", "emit", "parcel:7", '{"at": "depot"}')
        assert res.returncode == 0, res.stderr
        event_id = int(res.stdout)
        q.drain()
        row = s.execute(text("SELECT status::text, results FROM postjob.jobs WHERE id = :j"),
                        {"j": job_id}).one()
    assert tuple(row) == ("ok", [{"at": "depot"}])
    assert cli("event", "emit", "parcel:8").returncode == 0  # no payload: null
    with engine.connect() as conn:
        events = conn.execute(text("SELECT id, key, payload FROM postjob.events ORDER BY id")).all()
    assert [tuple(e) for e in events] == [(event_id, "parcel:7", {"at": "depot"}),
                                          (event_id + 1, "parcel:8", None)]


def test_prune_deletes_old_events(cli: Any, engine: Engine) -> None:
    assert cli("event", "emit", "old").returncode == 0
    with engine.begin() as conn:
        conn.execute(text("UPDATE postjob.events SET created_at = now() - interval '2 days'"))
    assert cli("event", "emit", "new").returncode == 0
    res = cli("event", "prune", "--older-than", "1d")
    assert res.returncode == 0, res.stderr
    assert "deleted 1 event(s)" in res.stdout
    with engine.connect() as conn:
        assert conn.execute(text("SELECT key FROM postjob.events")).scalars().all() == ["new"]


@pytest.mark.parametrize(("args", "needle"), [
    (["event", "emit", "k", "not json"], "PAYLOAD is not JSON"),
    (["event", "emit", ""], "an event key must be a non-empty string"),
    (["event", "prune", "--older-than", "soon"], "duration"),
    (["event", "prune", "--older-than", "300000000d"], "at most"),
    (["event", "prune", "--older-than", "1e300"], "at most"),
])
def test_bad_input_is_one_line(cli: Any, engine: Engine, args: list[str], needle: str) -> None:
    assert_bad_input(cli(*args), needle)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM postjob.events")).scalar_one() == 0
