"""The single-head way on an existing history: a revision of the shop's own history installs
postjob's schema (`postjob db revision` writes it), `alembic upgrade head` stays the one
command, and a later postjob_sa release is one more such revision, never a second head."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from alembic import command, op
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Engine, delete, select, text, update
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import Job, JobQueue, SchemaError, _migrations
from postjob_sa._host_history import write_revision
from postjob_sa._migrations import head_revision, revisions
from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.conftest import url_string
from tests.shop.app.models import Order
from tests.shop.conftest import (
    ADOPTION,
    BEFORE_ADOPTION,
    FULFIL_JOB,
    UPGRADES,
    Shop,
    heads,
    installed,
    place_orders,
    scalar,
    tables,
)

HEAD = head_revision()


def test_upgrade_head_adopts_postjob_into_the_existing_history(shop: Shop, shop_db: Engine) -> None:
    command.upgrade(shop.cfg(), BEFORE_ADOPTION)
    place_orders(shop_db)
    assert installed(shop_db) is None

    command.upgrade(shop.cfg(), "head")
    assert heads(shop_db) == (UPGRADES[-1],)
    assert installed(shop_db) == HEAD
    assert "postjob_alembic_version" not in tables(shop_db)
    assert scalar(shop_db, "SELECT string_agg(status, ',' ORDER BY id) FROM orders") == "new,new"

    # an order points at the job that fulfils it; pruning the job keeps the order
    with Session(shop_db) as s:
        job = JobQueue(s).enqueue("shop.fulfil", 1)
        s.execute(update(Order).where(Order.id == 1).values(fulfil_job_id=job.id))
        s.commit()
        s.execute(delete(Job).where(Job.id == job.id))
        s.commit()
        assert s.scalar(select(Order.fulfil_job_id).where(Order.id == 1)) is None

    command.check(shop.cfg())  # the shop's tables only: postjob's are left out
    command.check(shop.cfg("compare=postjob"))  # both: our revisions and models agree

    command.downgrade(shop.cfg(), BEFORE_ADOPTION)
    assert heads(shop_db) == (BEFORE_ADOPTION,)
    assert installed(shop_db) is None
    assert tables(shop_db, "public") == {"alembic_version", "customers", "orders"}
    assert scalar(shop_db, "SELECT count(*) FROM orders") == 2

    command.upgrade(shop.cfg(), "head")
    assert heads(shop_db) == (UPGRADES[-1],)
    assert installed(shop_db) == HEAD

    # each upgrade of postjob_sa was one more revision: stepping back one undoes only the last
    command.downgrade(shop.cfg(), "-1")
    assert heads(shop_db) == (UPGRADES[-2],)
    assert installed(shop_db) == revisions()[-2]
    command.upgrade(shop.cfg(), "head")
    assert installed(shop_db) == HEAD


def test_postjob_db_migrate_leaves_a_schema_the_shop_installed_alone(shop: Shop, shop_db: Engine) -> None:
    command.upgrade(shop.cfg(), "head")
    url = url_string(shop_db.url)
    assert_bad_input(postjob("db", "migrate", url=url), "managed by your app's Alembic", "alembic upgrade head")
    assert_bad_input(postjob("db", "downgrade", url=url), "managed by your app's Alembic", "alembic downgrade")
    with pytest.raises(SchemaError, match="alembic upgrade head"):
        postjob_sa.migrate(shop_db)
    assert "postjob_alembic_version" not in tables(shop_db)
    assert installed(shop_db) == HEAD
    status = postjob("db", "status", url=url)
    assert "managed:   by your app's Alembic migrations" in status.stdout, status.stderr


def _without_date(source: str) -> str:
    return "\n".join(ln for ln in source.splitlines() if not ln.startswith("Create Date:"))


def test_postjob_db_revision_writes_the_adoption_revision(shop: Shop) -> None:
    committed = shop.revision_file(ADOPTION).read_text()
    shop.forget(*reversed(UPGRADES), FULFIL_JOB, ADOPTION)

    res = postjob("db", "revision", "--rev-id", ADOPTION, "--to", "pj0001", cwd=shop.dir)
    assert res.returncode == 0, res.stderr
    path = f"migrations/versions/{ADOPTION}_postjob_schema_pj0001.py"
    assert res.stdout == (
        f"wrote {path}: postjob schema nothing -> pj0001, after your revision {BEFORE_ADOPTION}; "
        "apply it with `alembic upgrade head`\n"
    )
    assert _without_date((shop.dir / path).read_text()) == _without_date(committed)

    res = postjob("db", "revision", "--alembic-ini", str(shop.ini), "--to", "pj0001")
    assert res.returncode == 0, res.stderr  # nothing to write: done already
    assert f"already applies the postjob schema up to pj0001 (revision {ADOPTION})" in res.stdout
    assert sorted(p.name for p in shop.versions.glob("*.py"))[0].startswith(ADOPTION)


def test_postjob_db_revision_refuses_what_it_cannot_write(shop: Shop, tmp_path: Path) -> None:
    shop.forget(*reversed(UPGRADES), FULFIL_JOB, ADOPTION)
    before = sorted(shop.versions.iterdir())
    assert_bad_input(postjob("db", "revision", cwd=tmp_path), "no Alembic configuration at alembic.ini")
    res = postjob("db", "revision", "--to", "pj9999", "--alembic-ini", str(shop.ini))
    assert_bad_input(res, "unknown postjob revision 'pj9999'", "pj0001")

    mako = shop.dir / "migrations" / "script.py.mako"
    shop.edit(mako, '${imports if imports else ""}\n', "")
    res = postjob("db", "revision", "--alembic-ini", str(shop.ini))
    assert_bad_input(res, "has no ${imports} line")
    assert sorted(shop.versions.iterdir()) == before

    (shop.versions / "shop0004_fork.py").write_text(
        'revision = "shop0004"\ndown_revision = "shop0002"\n'
        "def upgrade(): pass\ndef downgrade(): pass\n"
    )
    res = postjob("db", "revision", "--alembic-ini", str(shop.ini))
    assert_bad_input(res, "2 heads", "alembic merge heads")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('migrations.upgrade(to=TARGET)', "must name its revision as a string"),
        ('migrations.upgrade(to="pj9999")', "names a revision this postjob_sa does not have"),
        ("depends_on = 'postjob'", "refers to 'postjob', which it does not contain"),
    ],
)
def test_postjob_db_revision_reads_the_history_it_builds_on(shop: Shop, call: str, message: str) -> None:
    if call.startswith("depends_on"):  # left over from the branch way
        shop.edit(shop.revision_file(FULFIL_JOB), "depends_on = None", call)
    else:
        shop.edit(shop.revision_file(ADOPTION), 'migrations.upgrade(to="pj0001")', call)
    res = postjob("db", "revision", "--alembic-ini", str(shop.ini))
    assert_bad_input(res, message)


def test_offline_sql_builds_the_same_database(
    shop: Shop, shop_db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    command.upgrade(shop.cfg(), "head", sql=True)
    script = capsys.readouterr().out
    assert "CREATE SCHEMA IF NOT EXISTS postjob" in script and "CREATE TABLE orders" in script
    _run_script(shop_db, script)
    assert heads(shop_db) == (UPGRADES[-1],)
    assert installed(shop_db) == HEAD
    command.check(shop.cfg("compare=postjob"))

    # a range that starts after the adoption: the history says pj0001 is there already
    command.downgrade(shop.cfg(), f"head:{BEFORE_ADOPTION}", sql=True)
    script = capsys.readouterr().out
    assert "DROP SCHEMA postjob CASCADE" in script
    _run_script(shop_db, script)
    assert heads(shop_db) == (BEFORE_ADOPTION,)
    assert installed(shop_db) is None


def test_offline_sql_without_the_named_paramstyle_is_refused_naming_the_setting(
    shop: Shop, shop_db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Flask-Migrate's env.py (and many others) configure offline mode without the paramstyle:
    every % in our functions would come out as %% in the script, silently."""
    env = shop.dir / "migrations" / "env.py"
    shop.edit(env, '        dialect_opts={"paramstyle": "named"},\n', "")
    with pytest.raises(CommandError) as refused:
        command.upgrade(shop.cfg(), "head", sql=True)
    assert str(refused.value) == (
        "offline SQL (--sql) with the paramstyle 'pyformat' writes every % in postjob's "
        "functions as %%: pass dialect_opts={\"paramstyle\": \"named\"} to "
        "context.configure() in run_migrations_offline() of your env.py")
    assert "%%" not in capsys.readouterr().out


def _run_script(engine: Engine, script: str) -> None:
    """As a DBA applies it: psql, one statement at a time (CREATE INDEX CONCURRENTLY cannot be
    part of a multi-statement string)."""
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    done = subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"],
                          input=script, text=True, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr


# -- a later postjob_sa release ---------------------------------------------------------------


def _one_more_revision(shop: Shop, engine: Engine, to: str, capsys: pytest.CaptureFixture[str],
                       compare_ours: bool = True) -> str:
    """The shop, adopted at pj0001 and running, upgrades postjob_sa: one more revision of its
    own takes our schema to ``to``. Returns the offline SQL of that revision."""
    shop.forget(*reversed(UPGRADES))  # written again here, the way a newer release writes it
    command.upgrade(shop.cfg(), "head")
    with engine.begin() as conn:  # a job of the pj0001 schema (this code enqueues for the head)
        job_id = conn.execute(text("INSERT INTO postjob.postjobs (workflow, args) "
                                   "VALUES ('shop.fulfil', '[2]') RETURNING id")).scalar_one()

    written = write_revision(shop.cfg(), to=to)  # what `postjob db revision` does
    assert (written.down_revision, written.before, written.to) == (FULFIL_JOB, "pj0001", to)
    source = written.path.read_text()
    assert f'migrations.upgrade(to="{to}")' in source
    assert 'migrations.downgrade(to="pj0001")' in source
    assert ScriptDirectory.from_config(shop.cfg()).get_heads() == [written.revision]

    command.upgrade(shop.cfg(), "head")
    assert heads(engine) == (written.revision,)
    assert installed(engine) == to
    assert scalar(engine, f"SELECT workflow FROM postjob.postjobs WHERE id = {job_id}") == "shop.fulfil"
    command.check(shop.cfg())
    if compare_ours and to == HEAD:  # our models describe the newest revision
        command.check(shop.cfg("compare=postjob"))

    command.upgrade(shop.cfg(), f"{FULFIL_JOB}:head", sql=True)
    offline = capsys.readouterr().out
    # it starts where the history left it (pj0010 makes the partitioned record LIKE the old)
    assert "CREATE SCHEMA IF NOT EXISTS postjob" not in offline
    assert "CREATE TABLE postjob.postjobs (\n" not in offline

    command.downgrade(shop.cfg(), "-1")
    assert heads(engine) == (FULFIL_JOB,)
    assert installed(engine) == "pj0001"
    command.upgrade(shop.cfg(), "head")
    assert installed(engine) == to
    return offline


@pytest.mark.parametrize("rev", revisions()[1:])
def test_a_later_release_is_one_more_revision(
    shop: Shop, shop_db: Engine, rev: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _one_more_revision(shop, shop_db, rev, capsys)


def _throwaway_step(previous: str) -> SimpleNamespace:
    """A revision after ours, written the way later revisions are: op.execute, and an index
    built CONCURRENTLY in an autocommit block."""

    def upgrade() -> None:
        op.execute("CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text "
                   "LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj9001'::text $$")
        with op.get_context().autocommit_block():
            op.execute("CREATE INDEX CONCURRENTLY unfinished_throwaway_idx ON postjob.unfinished (queue)")

    def downgrade() -> None:
        with op.get_context().autocommit_block():
            op.execute("DROP INDEX CONCURRENTLY postjob.unfinished_throwaway_idx")
        op.execute("CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text "
                   f"LANGUAGE sql IMMUTABLE AS $$ SELECT '{previous}'::text $$")

    return SimpleNamespace(revision="pj9001", module=SimpleNamespace(upgrade=upgrade, downgrade=downgrade))


def test_one_more_revision_runs_our_steps_in_order(
    shop: Shop, shop_db: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = _migrations.scripts()
    monkeypatch.setattr(_migrations, "_scripts", lambda: (*shipped, _throwaway_step(shipped[-1].revision)))
    offline = _one_more_revision(shop, shop_db, "pj9001", capsys, compare_ours=False)
    assert "CREATE INDEX CONCURRENTLY unfinished_throwaway_idx" in offline
    index = "SELECT indisvalid FROM pg_index WHERE indexrelid = 'postjob.unfinished_throwaway_idx'::regclass"
    assert scalar(shop_db, index) is True
