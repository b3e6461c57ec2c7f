"""``postjob history set | rotate | status [--json]``: the settings, a rotation's report, the
ranges with what pins them; bad input is one line and exit status 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.conftest import url_string

RANGES = text(
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = 'postjob.postjobs'::regclass")


@pytest.fixture
def cli(db_url: URL, engine: Engine, clean: None) -> Iterator[Any]:
    url = url_string(db_url)
    yield lambda *args: postjob(*args, url=url)
    with engine.begin() as conn:  # the record as the revision leaves it
        for (name,) in conn.execute(RANGES).all():
            if name not in ("postjobs_from_0", "postjobs_default"):
                conn.execute(text(f'DROP TABLE postjob."{name}"'))
        conn.execute(text("CREATE TABLE IF NOT EXISTS postjob.postjobs_from_0 PARTITION OF "
                          "postjob.postjobs FOR VALUES FROM (MINVALUE) TO (1000000)"))
        conn.execute(text("DELETE FROM postjob.history_settings"))
        conn.execute(text("DELETE FROM postjob.history_partitions"))


def test_set_rotate_and_status(cli: Any, engine: Engine) -> None:
    res = cli("history", "set", "--keep", "30d", "--partition-size", "1000")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("history: keep 30d00h, ranges of 1,000 ids")
    with engine.begin() as conn:
        conn.execute(text("SELECT setval('postjob.postjobs_id_seq', 1000499)"))
    with Session(engine) as s:
        job = JobQueue(s).enqueue("cli.hist", 1).id  # beyond the ranges: the default keeps it
        s.commit()
    res = cli("history", "rotate")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "created 2 range(s): postjobs_from_1000000, postjobs_from_1001000",
        "dropped 1 range(s), 0 job(s): postjobs_from_0"]
    res = cli("history", "status", "--json")
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert (status["keep_seconds"], status["partition_size"]) == (30 * 86400, 1000)
    assert [(r["name"], r["from_id"], r["to_id"], r["jobs"], r["pinned_by"])
            for r in status["ranges"]] == [
        ("postjobs_from_1000000", 1_000_000, 1_001_000, 1, job),  # its own tree, unfinished
        ("postjobs_from_1001000", 1_001_000, 1_002_000, 0, None),
        ("postjobs_default", None, None, 0, None)]
    res = cli("history", "status")
    assert res.returncode == 0, res.stderr
    assert "keep: 30d00h; ranges of 1,000 ids" in res.stdout
    assert f"job tree {job}" in res.stdout
    res = cli("history", "set", "--keep", "forever")  # the size stays
    assert res.stdout.startswith("history: keep for ever, ranges of 1,000 ids")


def test_bad_input_is_one_line(cli: Any) -> None:
    assert_bad_input(cli("history", "set"), "give --keep DURATION and/or --partition-size N")
    assert_bad_input(cli("history", "set", "--partition-size", "999"), "at least 1,000")
    assert_bad_input(cli("history", "set", "--keep", "soon"), "not a --keep duration")
    assert_bad_input(cli("history", "set", "--keep", "0s"), "more than 0 seconds")


def test_partition_size_and_keep_have_upper_bounds(cli: Any, engine: Engine) -> None:
    for size in ("9223372036854775807", "9223372036854775808", "1000000001"):
        assert_bad_input(cli("history", "set", "--partition-size", size), "at most")
    assert_bad_input(cli("history", "set", "--keep", "999999999d"), "at most")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM postjob.history_settings")).scalar() == 0


def test_status_says_where_the_open_range_ends(cli: Any) -> None:
    assert cli("history", "set", "--partition-size", "20000").returncode == 0
    assert cli("history", "rotate").returncode == 0
    res = cli("history", "status")
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("postjobs_from_0 "))
    assert "… to 20,000" in line, res.stdout
