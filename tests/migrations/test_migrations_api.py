"""postjob_sa.migrations from inside an Alembic operation context (what a host revision's
upgrade() and downgrade() see), and who may migrate a schema: `postjob db migrate` keeps to
the schemas it installed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import URL, Connection, Engine, create_engine, inspect, text

import postjob_sa
from postjob_sa import InvalidArgument, PostjobError, SchemaError, _migrations, migrations
from postjob_sa._migrations import installed_revision
from tests.cli.test_cli_db import assert_bad_input, postjob
from tests.conftest import create_clone, drop_database, url_string


@pytest.fixture
def empty(server_url: URL, template_db: str) -> Iterator[Engine]:
    url = create_clone(server_url, "template0", "migrations_api")
    engine = create_engine(url)
    yield engine
    engine.dispose()
    drop_database(server_url, url)


@contextmanager
def host_revision(engine: Engine) -> Iterator[Connection]:
    """What a revision of the host runs in: its migration's connection, proxied as ``op``."""
    with engine.begin() as conn, Operations.context(MigrationContext.configure(conn)):
        yield conn


def _installed(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return installed_revision(conn)


def _has_standalone_table(engine: Engine) -> bool:
    with engine.connect() as conn:
        return inspect(conn).has_table(_migrations.VERSION_TABLE)


def test_upgrade_and_downgrade_are_idempotent(empty: Engine) -> None:
    for _ in range(2):  # the second time the database says it is done: nothing runs
        with host_revision(empty):
            migrations.upgrade(to="pj0001")
        assert _installed(empty) == "pj0001"
    assert not _has_standalone_table(empty)
    for _ in range(2):
        with host_revision(empty):
            migrations.downgrade(to=None)
        assert _installed(empty) is None


@pytest.mark.parametrize("target", ["head", "heads", "pj9999", ""])
def test_unknown_targets_are_refused_before_anything_runs(empty: Engine, target: str) -> None:
    with host_revision(empty), pytest.raises(InvalidArgument, match="unknown revision"):
        migrations.upgrade(to=target)
    with host_revision(empty), pytest.raises(InvalidArgument, match="never 'head'"):
        migrations.downgrade(to=target)
    assert _installed(empty) is None


def test_outside_alembic_it_says_what_to_use() -> None:
    with pytest.raises(PostjobError, match=r"inside an Alembic revision .* postjob_sa.migrate"):
        migrations.upgrade(to="pj0001")


def _second_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A throwaway revision after ours, so that 'newer' and 'older' exist."""
    shipped = _migrations.scripts()
    previous = shipped[-1].revision

    def version(rev: str) -> str:
        return ("CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text "
                f"LANGUAGE sql IMMUTABLE AS $$ SELECT '{rev}'::text $$")

    module = SimpleNamespace(upgrade=lambda: migrations.op.execute(version("pj9001")),
                             downgrade=lambda: migrations.op.execute(version(previous)))
    monkeypatch.setattr(_migrations, "_scripts",
                        lambda: (*shipped, SimpleNamespace(revision="pj9001", module=module)))


def test_a_schema_newer_or_older_than_the_target_is_refused(
    empty: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _second_step(monkeypatch)
    with host_revision(empty):
        migrations.upgrade(to="pj9001")
    assert _installed(empty) == "pj9001"
    with host_revision(empty), pytest.raises(SchemaError, match="at pj9001, newer than pj0001"):
        migrations.upgrade(to="pj0001")

    with host_revision(empty):
        migrations.downgrade(to="pj0001")
    assert _installed(empty) == "pj0001"
    with host_revision(empty), pytest.raises(SchemaError, match="at pj0001, older than pj9001"):
        migrations.downgrade(to="pj9001")
    with host_revision(empty):
        migrations.downgrade(to=None)
    with host_revision(empty), pytest.raises(SchemaError, match="not installed, older than pj0001"):
        migrations.downgrade(to="pj0001")


def test_a_schema_from_a_newer_postjob_sa_is_refused(empty: Engine) -> None:
    with host_revision(empty):
        migrations.upgrade(to="pj0001")
    with empty.begin() as conn:
        conn.execute(text("CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text "
                          "LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0999'::text $$"))
    with host_revision(empty), pytest.raises(SchemaError, match="pj0999, a revision this postjob_sa does not have"):
        migrations.upgrade(to="pj0001")


def test_a_host_revision_takes_over_a_schema_that_migrate_installed(empty: Engine) -> None:
    """An app that used postjob_sa.migrate() adopts its own Alembic history."""
    postjob_sa.migrate(empty)
    assert _has_standalone_table(empty)
    with host_revision(empty):
        migrations.upgrade(to=_migrations.head_revision())  # finds it there: nothing to run
    assert not _has_standalone_table(empty)
    with pytest.raises(SchemaError, match="managed by your app's Alembic"):
        postjob_sa.migrate(empty)


def test_postjob_db_migrate_keeps_to_schemas_it_installed(empty: Engine) -> None:
    url = url_string(empty.url)
    with host_revision(empty):
        migrations.upgrade(to="pj0001")
    res = postjob("db", "migrate", url=url)
    assert_bad_input(res, "managed by your app's Alembic migrations", "alembic upgrade head")
    assert_bad_input(postjob("db", "downgrade", url=url), "alembic downgrade")
    with pytest.raises(SchemaError):
        postjob_sa.downgrade(empty)
    assert not _has_standalone_table(empty)
    assert _installed(empty) == "pj0001"
    res = postjob("db", "status", "--json", url=url)
    assert '"managed_by": "alembic"' in res.stdout

    with host_revision(empty):
        migrations.downgrade(to=None)
    res = postjob("db", "migrate", url=url)  # nothing installed: ours to install
    assert res.returncode == 0, res.stderr
    assert _has_standalone_table(empty)
    assert '"managed_by": "postjob"' in postjob("db", "status", "--json", url=url).stdout


def test_migrate_reinstalls_a_schema_dropped_behind_its_back(empty: Engine) -> None:
    postjob_sa.migrate(empty)
    with empty.begin() as conn:
        conn.execute(text("DROP SCHEMA postjob CASCADE"))
    postjob_sa.migrate(empty)  # its version table still said it was at the head
    assert _installed(empty) == _migrations.head_revision()


THROWAWAY = '''
from alembic import op

revision = "pj9001"
down_revision = "{previous}"


def _version(rev):
    op.execute("CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text "
               f"LANGUAGE sql IMMUTABLE AS $$ SELECT '{{rev}}'::text $$")


def upgrade():
    _version("pj9001")
    with op.get_context().autocommit_block():
        op.execute("CREATE INDEX CONCURRENTLY unfinished_throwaway_idx ON postjob.unfinished (queue)")


def downgrade():
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY postjob.unfinished_throwaway_idx")
    _version("{previous}")
'''


def test_migrate_runs_a_revision_with_an_autocommit_block(
    empty: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Standalone too, a later revision may build an index CONCURRENTLY: Alembic must own the
    transactions, not find one that our own checks left open."""
    for script in _migrations.scripts():
        shutil.copy(script.path, tmp_path)
    previous = _migrations.head_revision()
    (tmp_path / "pj9001_throwaway.py").write_text(THROWAWAY.format(previous=previous))
    monkeypatch.setattr(_migrations, "VERSIONS_DIR", tmp_path)
    postjob_sa.migrate(empty, previous)
    postjob_sa.migrate(empty)
    assert _installed(empty) == "pj9001"
    postjob_sa.downgrade(empty, previous)
    assert _installed(empty) == previous


def test_the_revision_ids_read_from_the_files_are_alembics_walk() -> None:
    """The schema check reads the revision ids without Alembic (it would cost every worker
    start and `postjob ps` about a second): they must be what Alembic finds."""
    assert _migrations.revision_ids() == tuple(s.revision for s in _migrations.scripts())
    assert _migrations.head_revision() == _migrations.scripts()[-1].revision
