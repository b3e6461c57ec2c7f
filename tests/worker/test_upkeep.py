"""The upkeep keeps the hot tables small when autovacuum does not (the test server runs with
``autovacuum = off``): it rebuilds an index a backlog swelled, vacuums dead rows (those a
VACUUM's own count lost too), analyzes the job record whose cached plans would scan it, one
worker at a time, never blocking a checkout, and where the worker's role may not repair it
says once what to run.

Backlogs pass through the queue as an application's do (enqueued, run by a worker), so the
tests hold whatever the hot tables are (postjob_sa._hot_tables)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from postjob_sa import JobQueue, Registry, _session_sql, workflow
from postjob_sa import _hot_tables as hot
from postjob_sa._db import Conn
from postjob_sa.cli import _statements
from postjob_sa.worker import upkeep as upkeep_module
from postjob_sa.worker.options import WorkerOptions
from postjob_sa.worker.upkeep import Upkeep

pytestmark = pytest.mark.both_drivers

W = "upkeep.w"
STANDING = "upkeep.standing"  # jobs that wait while others pass through
RUNS_W = Registry()
workflow(name=W, registry=RUNS_W)(lambda: None)

ENQUEUE = text(
    "INSERT INTO postjob.postjobs (workflow, queue, next_run_at) "
    "SELECT :w, 'q', now() - interval '1 hour' + g * interval '1 ms' "
    "FROM generate_series(1, :n) g")
#: Buffers this transaction read so far in the postjob schema.
BLOCKS = text(
    "SELECT COALESCE(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint "
    "FROM pg_class c WHERE c.relnamespace = 'postjob'::regnamespace AND c.relkind IN ('r', 'i')")
#: The index every checkout reads: the hot table's index of due jobs.
DUE_INDEX = text(
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_index i "
    "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE i.indrelid = ANY (CAST(:tables AS regclass[])) AND c.relname LIKE '%%\\_due\\_idx'")
PAGES = text("SELECT pg_relation_size(CAST(:name AS regclass)) / 8192")
DEAD = text("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = CAST(:t AS regclass)")
DELETED = text("SELECT n_tup_del FROM pg_stat_user_tables WHERE relid = CAST(:t AS regclass)")
REINDEXING = text("SELECT count(*) FROM pg_stat_progress_create_index")


@pytest.fixture
def admin(engine: Engine, clean: None) -> Iterator[Engine]:
    """Connections that are new every time (no generic plan cached from an earlier test)."""
    fresh = create_engine(engine.url, poolclass=NullPool)
    yield fresh
    fresh.dispose()


@pytest.fixture
def conns(engine: Engine) -> Iterator[Callable[..., Conn]]:
    """Autocommit connections of the worker's kind (closed at the end)."""
    opened: list[Conn] = []

    def open_conn(of: Engine = engine) -> Conn:
        opened.append(Conn.open(of, name="upkeep test"))
        return opened[-1]

    yield open_conn
    for c in opened:
        c.close()


def sql_all(engine: Engine, statement: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(statement)).scalars())


def upkeep_of(engine: Engine) -> Upkeep:
    return Upkeep(engine, WorkerOptions(identifier="upkeep-test"))


def sql(engine: Engine, statement: Any, **params: Any) -> Any:
    with engine.begin() as conn:
        result = conn.execute(statement if not isinstance(statement, str) else text(statement),
                              params)
        return result.scalar() if result.returns_rows else None


def vacuum_hot_tables(engine: Engine) -> None:
    """What autovacuum would do: a plain VACUUM of each hot table."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in hot.HOT_TABLES:
            conn.execute(text(conn.scalar(text("SELECT format('VACUUM ANALYZE %s', "
                                               "CAST(:t AS regclass))"), {"t": table})))


def churn(engine: Engine, n: int) -> None:
    """n jobs pass through the queue: enqueued, then run by a worker until none is due."""
    sql(engine, ENQUEUE, w=W, n=n)
    with Session(engine) as session:
        JobQueue(session, registry=RUNS_W, batch_size=1_000).drain()


def due_index(engine: Engine) -> str:
    name: str = sql(engine, DUE_INDEX, tables=list(hot.HOT_TABLES))
    return name


def checkout_buffers(engine: Engine, limit: int) -> int:
    """The buffers a checkout of ``limit`` reads, on a new connection (rolled back)."""
    with engine.connect() as conn:
        before = int(conn.execute(BLOCKS).scalar_one())
        got = conn.execute(_session_sql.JOB_CHECKOUT, {
            "worker_id": None, "identifier": "upkeep test", "workflows": [W], "versions": [""],
            "queues": None, "limit": limit, "lease": 60, "promote": False}).all()
        read = int(conn.execute(BLOCKS).scalar_one()) - before
        conn.rollback()
    assert len(got) == limit
    return read


def test_a_backlog_swells_the_due_index_and_the_upkeep_rebuilds_it(
    admin: Engine, conns: Callable[..., Conn]
) -> None:
    sql(admin, ENQUEUE, w=W, n=2_000)
    vacuum_hot_tables(admin)
    index = due_index(admin)
    fresh = {"pages": sql(admin, PAGES, name=index), "checkout 1": checkout_buffers(admin, 1),
             "checkout 100": checkout_buffers(admin, 100)}

    churn(admin, 200_000)  # the 2,000 and 200,000 more pass through
    sql(admin, ENQUEUE, w=W, n=2_000)
    vacuum_hot_tables(admin)  # autovacuum's visit empties the index's pages, and keeps them
    swollen = sql(admin, PAGES, name=index)
    assert swollen > 20 * fresh["pages"], (swollen, fresh)

    lines = upkeep_of(admin).look(conns(admin))
    assert any(line.startswith(f"upkeep: rebuilt {index} concurrently") for line in lines), lines
    after = {"pages": sql(admin, PAGES, name=index), "checkout 1": checkout_buffers(admin, 1),
             "checkout 100": checkout_buffers(admin, 100)}
    print(f"due index: {fresh['pages']} pages fresh, {swollen} after the backlog, "
          f"{after['pages']} rebuilt; buffers {fresh} -> {after}")
    assert after["pages"] <= 2 * fresh["pages"] + 1, (after, fresh)
    for what in ("checkout 1", "checkout 100"):
        assert after[what] <= 1.3 * fresh[what], (what, after, fresh)


def test_an_index_holding_live_rows_is_not_rebuilt_when_the_statistics_say_none(
    admin: Engine, conns: Callable[..., Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live count of the statistics is an estimate: the upkeep counts the rows before it
    rebuilds an index, so a big backlog whose count was lost is not rebuilt at every look."""
    monkeypatch.setattr(hot, "DEAD_ROWS", 1_000)
    sql(admin, ENQUEUE, w=W, n=60_000)
    vacuum_hot_tables(admin)
    for table in hot.HOT_TABLES:
        sql(admin, "SELECT pg_stat_reset_single_table_counters(CAST(:t AS regclass))", t=table)
    lines = upkeep_of(admin).look(conns(admin))
    assert not [line for line in lines if "rebuilt" in line], lines


def test_the_live_rows_of_stale_statistics_are_bounded_by_the_pages(admin: Engine) -> None:
    """A VACUUM that raced with deletes can leave the live count at the whole backlog while
    the table holds a few rows: what its pages can hold bounds it."""
    sql(admin, ENQUEUE, w=W, n=2_000)
    vacuum_hot_tables(admin)
    with admin.connect() as conn:
        state = [hot.Relation.of(r) for r in
                 conn.exec_driver_sql(hot.HOT_RELATIONS_STATE, hot.PARAMS).mappings()]
    table = next(r for r in state if r.name == hot.HOT_TABLES[0])
    stale = replace(table, live_rows=400_000)
    assert 2_000 <= stale.live_at_most < 10_000, (stale.live_at_most, table.pages)


def test_dead_rows_are_vacuumed_and_so_are_those_a_vacuum_lost_count_of(
    admin: Engine, conns: Callable[..., Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the threshold a hot table is vacuumed. The rows deleted while that VACUUM runs are
    lost from n_dead_tup (the VACUUM's count replaces it when it ends): the kill counter
    finds them, and the next look vacuums again."""
    monkeypatch.setattr(hot, "DEAD_ROWS", 1_000)
    table = hot.HOT_TABLES[0]
    churn(admin, 3_000)
    sql(admin, ENQUEUE, w=W, n=2_000)
    conn = conns(admin)
    conn.scalar("SELECT set_config('vacuum_cost_delay', '5', false)")  # a slow VACUUM
    conn.scalar("SELECT set_config('vacuum_cost_limit', '1', false)")
    upkeep = upkeep_of(admin)
    first: list[str] = []
    looking = threading.Thread(target=lambda: first.extend(upkeep.look(conn)))
    looking.start()
    phase = text("SELECT phase FROM pg_stat_progress_vacuum WHERE relid = CAST(:t AS regclass)")
    deadline = time.monotonic() + 60
    while sql(admin, phase, t=table) in (None, "initializing", "scanning heap"):
        assert time.monotonic() < deadline, first
        if not looking.is_alive():  # seen past its heap scan by no poll: the race cannot be had
            looking.join()
            pytest.skip(f"the VACUUM ended before a poll saw it past its heap scan: {first}")
        time.sleep(0.01)
    # the heap is scanned: the rows deleted now are live rows in the VACUUM's count
    deleted = int(sql(admin, DELETED, t=table))
    churn(admin, 0)  # the 2,000 pass through (each statement on a connection that ends)
    while int(sql(admin, DELETED, t=table)) < deleted + 2_000:  # their statistics are in
        time.sleep(0.01)
    assert looking.is_alive(), "the race was not reproduced: the VACUUM ended too soon"
    looking.join(60)
    assert any(line.startswith(f"upkeep: vacuumed {table}") for line in first), first
    dead = int(sql(admin, DEAD, t=table))
    if dead >= 1_000:  # the server kept the deletes in its dead count: nothing was lost
        second = upkeep.look(conn)
        assert any(line.startswith(f"upkeep: vacuumed {table}") for line in second), (dead, second)
        pytest.skip(f"the race was not reproduced: the dead count kept the deletes ({dead})")
    second = upkeep.look(conn)
    assert any(line.startswith(f"upkeep: vacuumed {table}") for line in second), (dead, second)


def test_what_a_burst_left_below_the_threshold_is_vacuumed_a_minute_later(
    admin: Engine, conns: Callable[..., Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst that ends leaves dead rows that no threshold reaches while the queue is quiet:
    the upkeep vacuums a table holding any once VACUUM_EVERY has passed since its last."""
    table = hot.HOT_TABLES[0]
    vacuum_hot_tables(admin)
    churn(admin, 2_000)  # a fifth of the threshold
    upkeep, conn = upkeep_of(admin), conns(admin)
    assert not [line for line in upkeep.look(conn) if line.startswith(f"upkeep: vacuumed {table}")]
    monkeypatch.setattr(hot, "VACUUM_EVERY", 0.5)
    time.sleep(1)
    lines = upkeep.look(conn)
    assert any(line.startswith(f"upkeep: vacuumed {table}") for line in lines), lines


def test_a_routine_vacuum_takes_no_lock_a_checkout_would_wait_for(
    admin: Engine, conns: Callable[..., Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Giving back the empty pages at a table's end takes an ACCESS EXCLUSIVE lock: a routine
    VACUUM of the upkeep does not (with a checkout under way, it would try for 5 s)."""
    monkeypatch.setattr(hot, "DEAD_ROWS", 1_000)
    sql(admin, ENQUEUE, w=STANDING, n=2_000)
    churn(admin, 3_000)  # their rows' pages, now empty, end the table
    held = HeldSnapshot(admin)  # a checkout's transaction, under way
    try:
        started = time.monotonic()
        lines = upkeep_of(admin).look(conns(admin))
        took = time.monotonic() - started
    finally:
        held.end()
    assert any(line.startswith(f"upkeep: vacuumed {hot.HOT_TABLES[0]} ") for line in lines)
    assert took < 3, f"the look took {took:.1f} s: the VACUUM waited to truncate"


def test_a_table_a_backlog_swelled_gets_its_empty_pages_back(
    admin: Engine, conns: Callable[..., Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hot, "DEAD_ROWS", 1_000)
    monkeypatch.setattr(hot, "SWELL", 2.0)
    table = hot.HOT_TABLES[0]
    sql(admin, ENQUEUE, w=STANDING, n=200)  # the first pages
    churn(admin, 20_000)
    before = sql(admin, PAGES, name=table)
    lines = upkeep_of(admin).look(conns(admin))
    assert any(line.startswith(f"upkeep: vacuumed {table}") and "giving back its empty pages"
               in line for line in lines), lines
    after = sql(admin, PAGES, name=table)
    assert after < before / 4, (before, after)


# -- repairs beside the queue's work -------------------------------------------------------------

LEFTOVERS = text(
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_index i "
    "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE i.indrelid = ANY (CAST(:tables AS regclass[])) AND NOT i.indisvalid")
REINDEX_RUNNING = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND state = 'active' AND query LIKE 'REINDEX%%'")


@pytest.fixture
def swollen(admin: Engine, monkeypatch: pytest.MonkeyPatch) -> str:
    """A due index swollen past the thresholds of this fixture (lower than the real ones, so
    20,000 jobs swell it), 200 jobs due, the hot tables vacuumed; returns the index."""
    monkeypatch.setattr(hot, "DEAD_ROWS", 1_000)
    monkeypatch.setattr(hot, "SWELL", 2.0)
    monkeypatch.setattr(hot, "MIN_SWOLLEN_BYTES", 4 * 8192)
    churn(admin, 20_000)
    sql(admin, ENQUEUE, w=W, n=200)
    vacuum_hot_tables(admin)
    return due_index(admin)


class HeldSnapshot:
    """A transaction that holds a snapshot and the due index (it ran a checkout): REINDEX
    CONCURRENTLY waits for it to end; a plain REINDEX would wait for its lock too."""

    def __init__(self, engine: Engine):
        self.conn = engine.connect()
        self.conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        self.conn.execute(_session_sql.JOB_CHECKOUT, {
            "worker_id": None, "identifier": "snapshot", "workflows": [W], "versions": [""],
            "queues": None, "limit": 1, "lease": 60, "promote": False}).all()

    def end(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def look_in_thread(upkeep: Upkeep, conn: Conn) -> tuple[threading.Thread, list[str]]:
    lines: list[str] = []
    thread = threading.Thread(target=lambda: lines.extend(upkeep.look(conn)), daemon=True)
    thread.start()
    return thread, lines


def test_two_workers_never_repair_at_once(
    swollen: str, admin: Engine, conns: Callable[..., Conn]
) -> None:
    first, second = upkeep_of(admin), upkeep_of(admin)
    held = HeldSnapshot(admin)
    try:
        thread, lines = look_in_thread(first, conns(admin))
        wait_for(lambda: sql(admin, REINDEX_RUNNING), "the first worker's REINDEX")
        other = conns(admin)
        other_thread, other_lines = look_in_thread(second, other)
        other_thread.join(5)
        assert not other_thread.is_alive(), "the second worker repairs too (and waits)"
        assert other_lines == [] and other.closed  # it does not hold the lock: it let go
        assert sql(admin, REINDEX_RUNNING) == 1
    finally:
        held.end()
    thread.join(30)
    assert any(line.startswith(f"upkeep: rebuilt {swollen}") for line in lines), lines


def test_a_checkout_goes_on_while_the_index_is_rebuilt(
    swollen: str, admin: Engine, conns: Callable[..., Conn]
) -> None:
    held = HeldSnapshot(admin)
    try:
        thread, lines = look_in_thread(upkeep_of(admin), conns(admin))
        wait_for(lambda: sql(admin, REINDEX_RUNNING), "the REINDEX")
        for _ in range(3):
            started = time.monotonic()
            with admin.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '3s'"))
                got = conn.execute(_session_sql.JOB_CHECKOUT, {
                    "worker_id": None, "identifier": "during", "workflows": [W],
                    "versions": [""], "queues": None, "limit": 1, "lease": 60,
                    "promote": False}).all()
            assert len(got) == 1 and time.monotonic() - started < 3
        assert sql(admin, REINDEX_RUNNING) == 1, "the REINDEX ended before the checkouts"
    finally:
        held.end()
    thread.join(30)
    assert any(line.startswith(f"upkeep: rebuilt {swollen}") for line in lines), lines


def test_what_an_interrupted_rebuild_leaves_is_dropped(
    swollen: str, admin: Engine, conns: Callable[..., Conn]
) -> None:
    """A worker that stops cancels its rebuild; the invalid index it leaves (which every
    insert would maintain) is dropped by the next look."""
    upkeep, conn = upkeep_of(admin), conns(admin)
    held = HeldSnapshot(admin)
    try:
        thread, _ = look_in_thread(upkeep, conn)
        wait_for(lambda: sql(admin, REINDEX_RUNNING), "the REINDEX")
        upkeep.stop()
        thread.join(10)
        assert not thread.is_alive(), "stop() did not interrupt the rebuild"
    finally:
        held.end()
    conn.close()  # as the duty's stop() does: the lock goes with it
    with admin.connect() as conn:
        left = conn.execute(LEFTOVERS, {"tables": list(hot.HOT_TABLES)}).scalars().all()
    assert left == [f"{swollen}_ccnew"], left
    lines = upkeep_of(admin).look(conns(admin))
    assert any(line.startswith(f"upkeep: dropped {swollen}_ccnew") for line in lines), lines
    with admin.connect() as conn:
        assert conn.execute(LEFTOVERS, {"tables": list(hot.HOT_TABLES)}).all() == []


def test_no_vacuum_while_an_old_transaction_holds_it_back_and_it_is_named_once(
    admin: Engine, conns: Callable[..., Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hot, "DEAD_ROWS", 1_000)
    monkeypatch.setattr(hot, "HELD_BACK_AFTER", 0.5)
    churn(admin, 3_000)
    held = HeldSnapshot(admin)
    try:
        pid = held.conn.execute(text("SELECT pg_backend_pid()")).scalar()
        time.sleep(1)
        upkeep, conn = upkeep_of(admin), conns(admin)
        lines = upkeep.look(conn)
        assert not [line for line in lines if line.startswith("upkeep: vacuumed")], lines
        assert [line for line in lines if f"transaction of pid {pid} " in line], lines
        assert upkeep.look(conn) == []  # said once
    finally:
        held.end()
    assert any(line.startswith("upkeep: vacuumed") for line in upkeep.look(conn))


@contextlib.contextmanager
def _without_autovacuum(engine: Engine) -> Iterator[None]:
    """No autovacuum of the record's ranges meanwhile (the embedded server runs one): its
    VACUUM or ANALYZE of the range a test just filled would plan a cached statement again
    before the upkeep does (CI saw a plan made afresh right after the insert)."""
    ranges = [str(r) for r in sql_all(engine, "SELECT inhrelid::regclass::text FROM pg_inherits "
                                              f"WHERE inhparent = '{hot.RECORD_TABLE}'::regclass")]
    for name in ranges:
        sql(engine, f"ALTER TABLE {name} SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        for name in ranges:
            sql(engine, f"ALTER TABLE {name} RESET (autovacuum_enabled)")


def test_the_job_record_is_analyzed_once_it_has_doubled_and_cached_plans_stop_scanning_it(
    admin: Engine, conns: Callable[..., Conn]
) -> None:
    """The outcome and checkout functions update job records by ids from an array under a
    generic plan (plan_cache_mode = force_generic_plan), cached for the session: made while
    the record was empty, it scans the record whole until an ANALYZE makes it plan again."""
    update = text("EXECUTE upkeep_touch(ARRAY[0]::bigint[])")

    def buffers(conn: Any) -> int:
        before = int(conn.execute(BLOCKS).scalar_one())
        conn.execute(update)
        read = int(conn.execute(BLOCKS).scalar_one()) - before
        conn.rollback()
        return read

    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"ANALYZE {hot.RECORD_TABLE}"))  # as a fresh install's: empty
    with _without_autovacuum(admin), admin.connect() as worker:  # plans while it is empty
        worker.execute(text("SET plan_cache_mode = force_generic_plan"))
        worker.execute(text(
            f"PREPARE upkeep_touch(bigint[]) AS UPDATE {hot.RECORD_TABLE} j "
            "SET updated_at = now() FROM unnest($1) AS i(id) WHERE j.id = ANY ($1) AND j.id = i.id"))
        worker.commit()
        buffers(worker)
        sql(admin, f"INSERT INTO {hot.RECORD_TABLE} (workflow, status, results) "
                   "SELECT :w, 'ok', '[1]' FROM generate_series(1, 50000)", w=W)
        scanned = buffers(worker)
        lines = upkeep_of(admin).look(conns(admin))
        assert any(line.startswith(f"upkeep: analyzed {hot.RECORD_TABLE}") for line in lines)
        after = buffers(worker)
    print(f"an update by ids read {scanned} buffers before the ANALYZE, {after} after")
    assert scanned > 500 and after < 20, (scanned, after)


# -- a worker's role, a worker's loop -----------------------------------------------------------


@pytest.fixture
def role_engine(admin: Engine, db_url: URL) -> Iterator[Engine]:
    """An engine of a LOGIN role granted what `postjob db grant` grants (not the owner)."""
    name = f"pj_upkeep_worker_{os.getpid()}"  # roles are the cluster's: one per test process
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER'))
        _, grants = conn.execute(_statements.ROLE_GRANTS, {"role": name}).one()
        for grant in grants:
            conn.execute(text(grant))
    engine = create_engine(db_url.set(username=name, password=None), poolclass=NullPool)
    yield engine
    engine.dispose()
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'DROP OWNED BY "{name}"'))
        conn.execute(text(f'DROP ROLE "{name}"'))


def test_a_role_that_does_not_own_the_tables_is_told_once_what_to_run(
    swollen: str, admin: Engine, role_engine: Engine, conns: Callable[..., Conn]
) -> None:
    churn(admin, 2_000)  # dead rows too
    table = hot.HOT_TABLES[0]
    pages = sql(admin, PAGES, name=swollen)
    upkeep, conn = upkeep_of(role_engine), conns(role_engine)
    lines = upkeep.look(conn)
    advice = {line.split("run, as its owner: ", 1)[1] for line in lines}
    assert any(a.startswith("VACUUM (INDEX_CLEANUP ON") and a.endswith(f") {table}")
               for a in advice), lines
    assert f"REINDEX INDEX CONCURRENTLY {swollen}" in advice, lines
    for line in lines:
        assert "\n" not in line and "may not repair it (only its owner may)" in line, line
        assert f"role pj_upkeep_worker_{os.getpid()} may not" in line, line
    assert sql(admin, PAGES, name=swollen) == pages  # nothing repaired, nothing raised
    assert upkeep.look(conn) == []  # said once


def test_a_running_worker_keeps_the_tables(
    swollen: str, admin: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep_module, "INTERVAL", 0.2)
    reg = Registry()
    workflow(name="upkeep.other", registry=reg)(lambda: None)  # it runs none of the jobs
    with Session(admin) as session:
        worker = JobQueue(session, registry=reg)._worker(handle_signals=False)
    pages = sql(admin, PAGES, name=swollen)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: sql(admin, PAGES, name=swollen) < pages / 4, "the rebuild", 30)
    finally:
        worker.stopper.request("the test is over")
        thread.join(15)
    assert not thread.is_alive()


# -- what operators see --------------------------------------------------------------------------


def test_ps_and_top_warn_that_autovacuum_is_off_and_name_a_table_it_never_visited(
    admin: Engine, db_url: URL
) -> None:
    from tests.cli.test_cli_db import postjob
    from tests.conftest import url_string

    table = hot.HOT_TABLES[0]
    churn(admin, 12_000)  # past the real threshold, and the test server has no autovacuum
    time.sleep(1.2)  # the statistics of the last connections are in
    url = url_string(db_url)
    listed = postjob("ps", url=url)
    assert listed.returncode == 0, listed.stderr
    warned = [line for line in listed.stderr.splitlines() if line.startswith("warning: ")]
    with admin.connect() as conn:  # the local test server runs without it, the embedded one with
        off = conn.execute(text("SHOW autovacuum")).scalar() == "off"
    assert any("autovacuum is off" in w and "ALTER SYSTEM SET autovacuum = on" in w
               for w in warned) == off, listed.stderr
    # (where autovacuum runs, it may well have visited the table meanwhile)
    assert any(w.startswith(f"warning: {table} holds ") and "has not visited it ever" in w
               for w in warned) or not off, listed.stderr
    assert "warning" not in listed.stdout  # what scripts read stays the table
    as_json = json.loads(postjob("ps", "--json", url=url).stdout)
    assert len(as_json["warnings"]) == len(warned), as_json["warnings"]
    top = postjob("ps", "top", "--iterations", "1", url=url)
    assert ("autovacuum is off" in top.stdout) == off, top.stdout
    assert f"{table} holds " in top.stdout or not off, top.stdout


def test_a_hot_table_whose_autovacuum_was_disabled_is_named_with_the_statement_that_resets_it(
    admin: Engine
) -> None:
    """On a server with autovacuum on (this one has it off: the server's own setting is
    replaced in the state read), a table disabled by its storage parameter is named."""
    table = hot.HOT_TABLES[0]
    with admin.begin() as conn:
        conn.execute(text(conn.execute(text("SELECT format('ALTER TABLE %s SET "
                                            "(autovacuum_enabled = off)', CAST(:t AS regclass))"),
                                       {"t": table}).scalar_one()))
    try:
        with admin.connect() as conn:
            state = [replace(r, autovacuum_on=True) for r in hot.read(conn)]
        lines = hot.warnings(state)
        assert lines == [f"autovacuum is off for {table}: ALTER TABLE {table} RESET "
                         "(autovacuum_enabled)"], lines
    finally:
        with admin.begin() as conn:  # the statement the warning gives, as it gives it
            conn.execute(text(lines[0].split(": ", 1)[1]))
        with admin.connect() as conn:
            assert all(r.autovacuum == r.autovacuum_on for r in hot.read(conn))
