"""The schema: revisions agree with the models, go up and down, and checkout uses an index."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Engine, Table, create_engine, inspect, text

import postjob_sa
from postjob_sa import _sql
from postjob_sa._migrations import ALEMBIC_DIR, VERSION_TABLE, head_revision, installed_revision
from tests.conftest import create_clone, drop_database


def _range(obj: object) -> bool:
    """A range of the job record (a partition: the rotation makes them, not the models)."""
    table = obj if isinstance(obj, Table) else getattr(obj, "table", None)
    name = getattr(table, "name", "")
    return isinstance(name, str) and (name.startswith("postjobs_from_")
                                      or name == "postjobs_default")


def _include(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    if type_ == "table" and name == VERSION_TABLE:
        return False
    return not (reflected and _range(obj))


def test_models_match_revisions(engine: Engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={"include_schemas": True, "include_object": _include, "compare_type": True},
        )
        diff = compare_metadata(ctx, postjob_sa.metadata)
    assert diff == []


def test_migrate_twice_is_a_no_op(engine: Engine) -> None:
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM pg_proc p JOIN pg_namespace n "
                                   "ON n.oid = p.pronamespace WHERE n.nspname = 'postjob'")).scalar()
    postjob_sa.migrate(engine)
    postjob_sa.migrate(engine)
    with engine.connect() as conn:
        assert installed_revision(conn) == head_revision()
        after = conn.execute(text("SELECT count(*) FROM pg_proc p JOIN pg_namespace n "
                                  "ON n.oid = p.pronamespace WHERE n.nspname = 'postjob'")).scalar()
    assert before == after


@pytest.fixture
def empty_db(server_url: URL) -> Iterator[Engine]:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS pjt_schema_empty WITH (FORCE)"))
        conn.execute(text("CREATE DATABASE pjt_schema_empty"))
    eng = create_engine(server_url.set(database="pjt_schema_empty"))
    yield eng
    eng.dispose()
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS pjt_schema_empty WITH (FORCE)"))
    admin.dispose()


def test_every_revision_goes_up_and_down(empty_db: Engine) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.set_main_option("path_separator", "os")
    revisions = [s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()]
    revisions.reverse()  # oldest first
    assert revisions[0] == "pj0001"
    for rev in revisions:
        postjob_sa.migrate(empty_db, rev)
        with empty_db.connect() as conn:
            assert installed_revision(conn) == rev
    for rev in reversed(revisions[:-1]):
        postjob_sa.downgrade(empty_db, rev)
        with empty_db.connect() as conn:
            assert installed_revision(conn) == rev
    postjob_sa.downgrade(empty_db, "base")
    with empty_db.connect() as conn:
        assert installed_revision(conn) is None
        assert "postjob" not in inspect(conn).get_schema_names()
    postjob_sa.migrate(empty_db)
    with empty_db.connect() as conn:
        assert installed_revision(conn) == head_revision()


def test_functions_work_without_postjob_on_the_search_path(engine: Engine, clean: None) -> None:
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL search_path = pg_catalog"))
        conn.execute(text("INSERT INTO postjob.postjobs (workflow) VALUES ('w'), ('w')"))
        rows = conn.execute(text(
            "SELECT id FROM postjob.checkout_v4(NULL, 'x', ARRAY['w'], ARRAY[''], NULL, 1, 60, "
            "true, false, false)")).all()
        assert len(rows) == 1
        params = {k: "{}" for k in (
            "ok_ids", "ok_tokens", "ok_results", "ok_versions", "ids", "tokens", "kinds",
            "errors", "messages", "backtraces", "versions", "awaiting", "delays", "stopped",
            "stopped_tokens")}
        kinds = conn.exec_driver_sql(_sql.WORKER_CYCLE, {
            **params, "worker_id": None, "workflows": ["w"], "versions": [""], "queues": None,
            "limit": 5, "lease": 60, "reap": True, "promote": True}).scalars().all()
        assert kinds == ["job"]
        assert conn.execute(text("SELECT postjob.reap_v4()")).scalar() == 0


#: The functions of the hot path: checkout, the cycle, the outcomes it records, the idle wait.
HOT_PATH = ("checkout_v4", "_checkout_counted", "_promote", "finish_v4", "_settle",
            "worker_idle_v2")
#: SQL functions the hot path's statements take in (PostgreSQL inlines them: no call, no plan
#: of their own); a SET clause, plpgsql or VOLATILE would make each a call again.
INLINED = ("_due_groups", "_served_keys", "_limited_queues")


def test_the_hot_path_is_planned_once_per_session_and_never_compiled(engine: Engine) -> None:
    """Its statements take arrays: left to choose, PostgreSQL planned them again on every call
    (a one-job cycle 2.3 ms, 1.6 ms with cached plans); the generic plans are costed for any
    batch and pass jit_above_cost (with JIT on, PostgreSQL's default, a checkout of 100 jobs
    spent 20 ms compiling and 1 ms running)."""
    with engine.connect() as conn:
        settings = dict(conn.execute(text(
            "SELECT p.proname, p.proconfig FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'postjob' AND p.proname = ANY(:names)"),
            {"names": list(HOT_PATH)}).all())
    assert set(settings) == set(HOT_PATH)
    for name, config in settings.items():
        assert {"plan_cache_mode=force_generic_plan", "jit=off"} <= set(config or []), (name, config)


def test_the_checkouts_helpers_are_inlined_into_its_statements(engine: Engine) -> None:
    with engine.connect() as conn:
        for queues in (None, ["q"]):
            plan = "\n".join(conn.execute(text(
                "EXPLAIN SELECT * FROM postjob._due_groups(ARRAY['w'], ARRAY['1'], :queues)"),
                {"queues": queues}).scalars())
            plan += "\n".join(conn.execute(text(
                "EXPLAIN SELECT * FROM postjob._limited_queues(ARRAY['w'], ARRAY['1'], :queues)"),
                {"queues": queues}).scalars())
            for name in INLINED:
                assert f"Function Scan on {name}" not in plan, plan


def test_checkout_hands_out_by_id_on_a_small_table(server_url: URL, template_db: str) -> None:
    """A cached plan outlives the table it was made for: planned on a table of a few thousand
    jobs, a join from the picked jobs to the table became a scan of the whole table on every
    checkout (the drain at one job per round trip fell to half). Checkout reaches the jobs it
    hands out through the primary key, whatever the table's size when it was planned."""
    url = create_clone(server_url, template_db, "small_table")
    eng = create_engine(url)
    try:
        with eng.begin() as conn:
            conn.execute(text(
                "INSERT INTO postjob.postjobs (workflow, args) "
                "SELECT 'w', jsonb_build_array(g) FROM generate_series(1, 3000) g"))
        with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE postjob.postjobs"))
        with eng.begin() as conn:
            for limit in (1, 100, 100):
                taken = conn.execute(text(
                    "SELECT id FROM postjob.checkout_v4(NULL, NULL, ARRAY['w'], ARRAY[''], "
                    "NULL, :n, 60, false, false, true)"), {"n": limit}).all()
                assert len(taken) == limit
            seq = conn.execute(text(
                "SELECT seq_scan FROM pg_stat_xact_user_tables "
                "WHERE schemaname = 'postjob' AND relname = 'postjobs'")).scalar_one()
            assert seq == 0
    finally:
        eng.dispose()
        drop_database(server_url, url)


def test_the_public_metadata_holds_every_table_on_first_use() -> None:
    """A host's env.py reads ``postjob_sa.metadata`` in a fresh process: a table missing from
    it (the durable ones live in their own module) would be autogenerated away as
    'remove_table'."""
    out = subprocess.run(
        [sys.executable, "-c", "import postjob_sa; print(sorted(postjob_sa.metadata.tables))"],
        capture_output=True, text=True, check=True).stdout
    for table in ("postjob.postjobs", "postjob.steps", "postjob.events", "postjob.event_waits"):
        assert table in out, out
