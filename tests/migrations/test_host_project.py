"""A host project applies our branch with its own `alembic upgrade heads` (the documented way)
and its autogenerate leaves our objects alone, or includes them consistently."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import URL, Engine, create_engine, inspect, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa._migrations import installed_revision
from tests.conftest import drop_database
from tests.host_project.models import HostBase, Widget

HOST = Path(__file__).parents[1] / "host_project"
DB = "pjt_host_project"


@pytest.fixture
def host_engine(server_url: URL) -> Iterator[Engine]:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{DB}"'))
    admin.dispose()
    eng = create_engine(server_url.set(database=DB))
    yield eng
    eng.dispose()
    drop_database(server_url, server_url.set(database=DB))


def _run(engine: Engine, fn: object, *args: str, mode: str = "mine") -> None:
    cfg = Config(str(HOST / "alembic.ini"))
    cfg.attributes["metadata_mode"] = mode
    # not engine.begin(): Alembic must own the transactions, or a revision's autocommit block
    # (CREATE INDEX CONCURRENTLY) fails
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        fn(cfg, *args)  # type: ignore[operator]


def _heads(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(MigrationContext.configure(conn).get_current_heads())


def test_upgrade_heads_downgrade_our_branch_and_upgrade_again(host_engine: Engine) -> None:
    _run(host_engine, command.upgrade, "heads")
    assert "host0001" in _heads(host_engine)
    with host_engine.connect() as conn:
        assert installed_revision(conn) == postjob_sa._migrations.head_revision()
    with Session(host_engine) as s:
        job = postjob_sa.JobQueue(s).enqueue("build_widget", 1)
        s.add(Widget(name="w", job_id=job.id))
        s.commit()

    # our branch cannot go while the host's revision depends on it: alembic takes both down
    _run(host_engine, command.downgrade, "postjob@base")
    with host_engine.connect() as conn:
        assert installed_revision(conn) is None
        assert "postjob" not in inspect(conn).get_schema_names()
    assert _heads(host_engine) == set()

    _run(host_engine, command.upgrade, "heads")
    assert "host0001" in _heads(host_engine)
    with host_engine.connect() as conn:
        assert installed_revision(conn) == postjob_sa._migrations.head_revision()
        assert inspect(conn).has_table("widgets")


@pytest.mark.parametrize("mode", ["mine", "both"])
def test_autogenerate_is_clean(host_engine: Engine, mode: str) -> None:
    _run(host_engine, command.upgrade, "heads")
    metadata = [HostBase.metadata] if mode == "mine" else [HostBase.metadata, postjob_sa.metadata]
    with host_engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_object": (postjob_sa.include_object if mode == "mine"
                                   else postjob_sa.include_postjob_schema),
                "target_metadata": metadata,
            },
        )
        diff = compare_metadata(ctx, metadata)
    assert diff == []


def test_our_revisions_apply_offline_as_sql(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = Config(str(HOST / "alembic.ini"))
    command.upgrade(cfg, "postjob@head", sql=True)
    out = capsys.readouterr().out
    assert "CREATE OR REPLACE FUNCTION" in out or "CREATE FUNCTION postjob.checkout" in out
