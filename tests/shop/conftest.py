"""The shop (tests/shop/app): an app whose Alembic history predates postjob_sa.

Each test works on a copy of it in a temporary directory (revisions get written there) and on
an empty database that ``DATABASE_URL`` names, as a deploy would run it."""

from __future__ import annotations

import os
import shutil
import sys
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import URL, Engine, create_engine, inspect, text

from postjob_sa._migrations import installed_revision
from tests.conftest import drop_database, url_string

ROOT = Path(__file__).resolve().parents[2]
SHOP = ROOT / "tests" / "shop" / "app"
#: the revision `postjob db revision` wrote (it brings our schema to pj0001) ...
ADOPTION = "0ba0f0330356"
#: ... the one `alembic revision --autogenerate` wrote next (orders.fulfil_job_id) ...
FULFIL_JOB = "85a938654cea"
#: ... and the ones `postjob db revision` wrote at each upgrade of postjob_sa since, oldest first
#: (our schema to pj0003, pj0004, pj0005, pj0006, pj0007, pj0008, pj0009, pj0010 and pj0011, the head)
UPGRADES = ("5c2d81e07a44", "4b5e394ca18a", "9a9e5cf938d9", "5053e053e126", "a709e11b25d7",
            "23df5c22f2bb", "0417b804b548", "6e1d3c2b9a40", "806e08af641d")
BEFORE_ADOPTION = "shop0003"


@dataclass
class Shop:
    dir: Path

    @property
    def ini(self) -> Path:
        return self.dir / "alembic.ini"

    @property
    def versions(self) -> Path:
        return self.dir / "migrations" / "versions"

    def cfg(self, *x: str) -> Config:
        """What `alembic -c alembic.ini [-x ...]` reads."""
        return Config(str(self.ini), cmd_opts=Namespace(x=list(x), quiet=True))

    def revision_file(self, rev: str) -> Path:
        (path,) = self.versions.glob(f"{rev}_*.py")
        return path

    def forget(self, *revs: str) -> None:
        """Go back to before these revisions were written."""
        for rev in revs:
            self.revision_file(rev).unlink()

    def edit(self, path: Path, old: str, new: str) -> None:
        source = path.read_text()
        assert old in source, (path, old)
        path.write_text(source.replace(old, new, 1))


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Shop:
    monkeypatch.setattr(sys, "path", list(sys.path))  # alembic prepends prepend_sys_path
    target = tmp_path / "shop"
    shutil.copytree(SHOP, target, ignore=shutil.ignore_patterns("__pycache__"))
    copy = Shop(target)
    # env.py imports tests.shop.app.models from this checkout
    copy.edit(copy.ini, "prepend_sys_path = %(here)s/../../..", f"prepend_sys_path = {ROOT}")
    return copy


@pytest.fixture
def shop_db(server_url: URL, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    url = server_url.set(database=f"pjt_{os.getpid()}_shop")  # worktrees share the server
    drop_database(server_url, url)
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    admin.dispose()
    monkeypatch.setenv("DATABASE_URL", url_string(url))
    engine = create_engine(url)
    yield engine
    engine.dispose()
    drop_database(server_url, url)


def heads(engine: Engine) -> tuple[str, ...]:
    """What the host's alembic_version holds."""
    with engine.connect() as conn:
        return tuple(sorted(MigrationContext.configure(conn).get_current_heads()))


def installed(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return installed_revision(conn)


def tables(engine: Engine, schema: str | None = None) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names(schema=schema))


def scalar(engine: Engine, sql: str) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def place_orders(engine: Engine) -> None:
    """The shop at work before it adopts postjob_sa."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO customers (id, email) VALUES (1, 'ada@example.com')"))
        conn.execute(text("INSERT INTO orders (id, customer_id, total) VALUES (1, 1, 12.50), (2, 1, 3)"))
