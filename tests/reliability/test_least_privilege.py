"""Least privilege: ``postjob db grant ROLE`` gives a LOGIN role (no superuser) exactly what a
worker and an enqueuing application need; the role runs both, and cannot change the schema."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from postjob_sa._db import sqlstate
from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.conftest import dbapi_connect, url_string
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for

pytestmark = pytest.mark.both_drivers

FINGERPRINT = (
    "SELECT md5(string_agg(p::text, '|' ORDER BY p::text)) FROM ("
    "SELECT grantee || ':' || table_name || ':' || privilege_type AS p "
    "FROM information_schema.role_table_grants WHERE table_schema = 'postjob' "
    "UNION ALL SELECT nspname || ':' || array_to_string(nspacl, ',') FROM pg_namespace "
    "WHERE nspname = 'postjob') x"
)


def _as_admin(engine: Engine, *statements: str) -> None:
    """Run statements as they are (no parameters: a '%' in a role name stays itself)."""
    conn = dbapi_connect(engine.url)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def _quoted(name: str) -> str:
    """An identifier as PostgreSQL reads it (SQLAlchemy's preparer doubles '%' for pyformat)."""
    return '"' + name.replace('"', '""') + '"'


def _create_role(engine: Engine, name: str) -> None:
    role = _quoted(name)
    _as_admin(engine, f"DROP ROLE IF EXISTS {role}",
              f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")


def _drop_role(engine: Engine, name: str) -> None:
    role = _quoted(name)
    _as_admin(engine, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


@pytest.fixture
def role(runs: Engine) -> Iterator[str]:
    """A LOGIN role, no superuser, unique to this run (roles are cluster-wide)."""
    name = f"pj_rel_worker_{os.getpid()}"
    _create_role(runs, name)
    yield name
    _drop_role(runs, name)


def test_a_granted_role_enqueues_and_works_but_cannot_change_the_schema(
    db_url: URL, runs: Engine, role: str, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    as_role = db_url.set(username=role, password=None)
    with engine.begin() as conn:  # the application's own side table is its business
        conn.execute(text(f'GRANT INSERT ON rel_runs TO "{role}"'))

    # before the grant the role cannot even see the queue
    res = postjob("job", "enqueue", "rel.record", "1", url=url_string(as_role))
    assert_bad_input(res, "permission denied for schema postjob", "postjob db grant ROLE")

    res = postjob("db", "grant", role, url=url_string(db_url))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == f"GRANT USAGE ON SCHEMA postjob TO {role}"
    assert f"granted to {role} on " in res.stdout  # quoted as PostgreSQL does: only if needed
    assert postjob("db", "grant", role, url=url_string(db_url)).returncode == 0  # idempotent

    # enqueue as the role: CLI and API (with a child and a manual token on the way)
    res = postjob("job", "enqueue", "rel.record", "1", "--tags", "by:cli", url=url_string(as_role))
    assert res.returncode == 0, res.stderr
    role_engine = create_engine(as_role)
    try:
        with Session(role_engine) as s:
            q = JobQueue(s)
            q.enqueue("rel.record", 2)
            q.enqueue("rel.parent", 3, 0.0)
            q.emit_event("granted", "yes")  # and durable workflows: events, steps, sleeps
            q.enqueue("dur.waiter", "granted")
            q.enqueue("dur.nap", 0)
            s.commit()
        proc = workers(as_role, "--fast", "--batch", "2", "--import", "tests.durable.durable_app")
        wait_for(lambda: scalar(engine, "SELECT count(*) FILTER (WHERE status = 'ok') = count(*) "
                                        "FROM postjob.postjobs"), 20, "every job ok")
        assert scalar(engine, "SELECT count(*) FROM postjob.postjobs") == 6  # 5 + a child
        assert scalar(engine, "SELECT count(*) FROM postjob.steps") == 3
        listing = postjob("ps", "--json", "--tags", "by:cli", url=url_string(as_role))
        assert [j["status"] for j in json.loads(listing.stdout)["jobs"]] == ["ok"]
        assert postjob("reap", url=url_string(as_role)).returncode == 0
        res = postjob("job", "prune", "--older-than", "1s", "--dry-run", url=url_string(as_role))
        assert res.returncode == 0, res.stderr
        assert proc.stop() == 0, proc.log()
        assert "permission denied" not in proc.log()
        with Session(role_engine) as s:  # history: its settings, a rotation, its status
            q = JobQueue(s)
            q.set_history(keep=timedelta(days=30))
            assert not q.rotate_history().busy
            assert [r.name for r in q.history_status()][-1] == "postjobs_default"
            s.commit()
    finally:
        role_engine.dispose()

    # and it can change nothing about the schema
    forbidden = [
        "DROP SCHEMA postjob CASCADE",
        "DROP TABLE postjob.postjobs",
        "TRUNCATE postjob.postjobs",
        "ALTER TABLE postjob.postjobs ADD COLUMN evil int",
        "ALTER TABLE postjob.tokens DISABLE TRIGGER ALL",
        "CREATE TABLE postjob.evil (id int)",
        "DROP FUNCTION postjob.checkout_v4",
        "ALTER FUNCTION postjob.reap(boolean, integer) SECURITY DEFINER",
        "CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text "
        "LANGUAGE sql AS $$ SELECT 'x' $$",
        "DROP SEQUENCE postjob.lease_tokens",
        "ALTER SEQUENCE postjob.lease_tokens RESTART",
        "SELECT setval('postjob.lease_tokens', 1)",
        "DROP TYPE postjob.statuses CASCADE",
    ]
    conn = dbapi_connect(as_role)
    try:
        for statement in forbidden:
            with conn.cursor() as cur, pytest.raises(Exception) as refused:
                cur.execute(statement)
            assert sqlstate(refused.value) == "42501", (statement, refused.value)  # no privilege
    finally:
        conn.close()
    assert scalar(engine, "SELECT count(*) FROM information_schema.columns "
                          "WHERE table_schema = 'postjob' AND column_name = 'evil'") == 0
    report(f"least privilege: a granted LOGIN role enqueued (CLI, API) and ran a worker; "
           f"{len(forbidden)} DDL/TRUNCATE/setval statements refused")


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ('x"; DROP SCHEMA postjob CASCADE; --', "no role named"),
        ("no_such_role_xyz", "no role named 'no_such_role_xyz'"),
        ("", "must not be empty"),
        ("r" * 64, "longer than 63 bytes"),
    ],
)
def test_grant_refuses_bad_role_names_and_writes_nothing(
    db_url: URL, runs: Engine, name: str, needle: str
) -> None:
    before = scalar(runs, FINGERPRINT)
    assert_bad_input(postjob("db", "grant", name, url=url_string(db_url)), needle)
    assert scalar(runs, FINGERPRINT) == before
    assert scalar(runs, "SELECT count(*) FROM pg_namespace WHERE nspname = 'postjob'") == 1


def test_grant_quotes_an_odd_but_real_role_name(db_url: URL, runs: Engine) -> None:
    odd = f'Odd "Role" 100%s; DROP SCHEMA postjob; -- {os.getpid()}'
    _create_role(runs, odd)
    try:
        res = postjob("db", "grant", odd, url=url_string(db_url))
        assert res.returncode == 0, res.stderr
        assert scalar(runs, "SELECT has_schema_privilege(:r, 'postjob', 'USAGE') "
                            "AND has_table_privilege(:r, 'postjob.postjobs', 'UPDATE') "
                            "AND NOT has_table_privilege(:r, 'postjob.postjobs', 'TRUNCATE') "
                            "AND has_sequence_privilege(:r, 'postjob.lease_tokens', 'USAGE') "
                            "AND has_function_privilege(:r, 'postjob.reap(boolean, integer)', "
                            "'EXECUTE')", r=odd) is True
        assert scalar(runs, "SELECT count(*) FROM pg_namespace WHERE nspname = 'postjob'") == 1
    finally:
        _drop_role(runs, odd)


#: What `postjob db grant` of the pj0007 release granted (its tables then).
PJ0007_GRANTS = (
    "GRANT USAGE ON SCHEMA postjob TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE postjob.postjobs, postjob.tokens, "
    "postjob.workers, postjob.queue_limits, postjob.schedules TO {role}",
    "GRANT USAGE ON SEQUENCE postjob.postjobs_id_seq, postjob.tokens_id_seq, "
    "postjob.workers_id_seq, postjob.lease_tokens TO {role}",
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA postjob TO {role}",
)


def test_a_role_granted_before_an_upgrade_keeps_working_after_it(
    server_url: URL, role: str
) -> None:
    """The upgrade to pj0008 grants the roles that could use the jobs table the same on its new
    tables: a worker of a role granted at pj0007 runs jobs once the schema is at pj0008."""
    from postjob_sa import Registry, migrate, workflow
    from tests.conftest import create_clone, drop_database

    url = create_clone(server_url, "template0", "grant_upgrade")
    admin = create_engine(url)
    try:
        migrate(admin, "pj0007")
        _as_admin(admin, *(g.format(role=_quoted(role)) for g in PJ0007_GRANTS))
        migrate(admin)
        reg = Registry()

        @workflow(name="grant.echo", registry=reg)
        def echo(x: int) -> int:
            return x

        as_role = create_engine(url.set(username=role, password=None))
        try:
            with Session(as_role) as s:
                q = JobQueue(s, registry=reg, fast_mode=True)
                job_id = q.enqueue(echo, 5).id
                s.commit()
                assert q.drain() == 1
        finally:
            as_role.dispose()
        assert scalar(admin, f"SELECT status::text FROM postjob.postjobs WHERE id = {job_id}") == "ok"
    finally:
        admin.dispose()
        drop_database(server_url, url)
