"""Applying the package's Alembic revisions, standalone or inside a host project."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from alembic.command import downgrade as _alembic_downgrade
from alembic.command import upgrade as _alembic_upgrade
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine

from postjob_sa import _sql
from postjob_sa.errors import SchemaError
from postjob_sa.models import SCHEMA

ALEMBIC_DIR = Path(__file__).parent / "alembic"
VERSIONS_DIR = ALEMBIC_DIR / "versions"
#: Where ``alembic.ini`` of a host project finds our revisions (``version_locations``).
VERSION_LOCATION = "postjob_sa:alembic/versions"
#: The version table of standalone migrations (hosts keep their own alembic_version).
VERSION_TABLE = "postjob_alembic_version"
BRANCH = "postjob"
MIGRATE_HINT = (
    "run `postjob db migrate` (or `alembic upgrade heads` in a project whose alembic.ini "
    f"lists {VERSION_LOCATION} in version_locations)"
)

Bind = Engine | Connection | str


def read_revision(scalar: Callable[[str], Any]) -> str | None:
    """The installed revision, or None without a schema; ``scalar`` runs one statement."""
    if scalar(_sql.SCHEMA_EXISTS) is None:
        return None
    return str(scalar(_sql.SCHEMA_REVISION))


def read_oldest_served(scalar: Callable[[str], Any]) -> str | None:
    """The oldest code revision the installed schema still serves (None: only its own)."""
    if scalar(_sql.SCHEMA_OLDEST_SERVED_EXISTS) is None:
        return None
    return str(scalar(_sql.SCHEMA_OLDEST_SERVED))


def _config(connection: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", str(VERSIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head_revision() -> str:
    """The newest revision of the ``postjob`` branch shipped with this package."""
    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.set_main_option("path_separator", "os")
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


@contextlib.contextmanager
def _connection(bind: Bind) -> Iterator[Connection]:
    if isinstance(bind, Connection):
        yield bind
        return
    engine = create_engine(bind) if isinstance(bind, str) else bind
    try:
        with engine.connect() as conn:
            yield conn
            if conn.in_transaction():
                conn.commit()
    finally:
        if isinstance(bind, str):
            engine.dispose()


def installed_revision(conn: Connection) -> str | None:
    """The revision of the ``postjob`` schema in this database, or None if it is absent."""
    return read_revision(lambda sql: conn.exec_driver_sql(sql).scalar())


def _stamp_if_adopted(conn: Connection) -> None:
    """A schema created by a host's `alembic upgrade heads` is adopted, not re-created."""
    rev = installed_revision(conn)
    if rev is None:
        return
    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    if not ctx.get_current_heads():
        ctx.stamp(ScriptDirectory.from_config(_config(conn)), rev)


def _hand_over(conn: Connection, bind: Bind) -> None:
    """End the transaction our own checks began, so that Alembic manages the transactions of
    the migrations (and can run a step outside them); a caller's connection is left as it is."""
    if not isinstance(bind, Connection) and conn.in_transaction():
        conn.commit()


def migrate(bind: Bind, revision: str = "heads") -> None:
    """Bring the ``postjob`` schema to the newest revision; idempotent.

    ``bind`` is an Engine, a Connection (the caller commits) or a database URL.
    """
    with _connection(bind) as conn:
        _stamp_if_adopted(conn)
        _hand_over(conn, bind)
        _alembic_upgrade(_config(conn), revision)


def downgrade(bind: Bind, revision: str = "base") -> None:
    """Downgrade the ``postjob`` schema; ``base`` drops the schema and every job in it."""
    with _connection(bind) as conn:
        _stamp_if_adopted(conn)
        _hand_over(conn, bind)
        _alembic_downgrade(_config(conn), revision)


def check_revision(installed: str | None, oldest_served: str | None = None) -> None:
    """Raise :class:`SchemaError`, with what to do, unless this code can work on the schema.

    Code works on its own revision and on newer ones that still serve it (the schema's
    ``oldest_served_code``), so migrating first and then rolling the workers never stops them.
    Revision ids sort in the order they were made (pj0001, pj0002, ...).
    """
    head = head_revision()
    if installed is None:
        raise SchemaError(f"the postjob schema is missing from this database: {MIGRATE_HINT}")
    if installed == head:
        return
    if installed < head:
        raise SchemaError(
            f"the postjob schema is at revision {installed}, this code needs {head}: {MIGRATE_HINT}"
        )
    if oldest_served is not None and oldest_served <= head:
        return
    raise SchemaError(
        f"the postjob schema is at revision {installed}, which no longer serves this code "
        f"(written for {head}): upgrade postjob_sa where this runs"
    )


def check_schema(conn: Connection) -> None:
    """:func:`check_revision` of the schema this connection sees."""

    def scalar(sql: str) -> Any:
        return conn.exec_driver_sql(sql).scalar()

    check_revision(read_revision(scalar), read_oldest_served(scalar))


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """For a host's env.py: keep autogenerate away from the ``postjob`` schema.

    Pass it as ``context.configure(include_object=postjob_sa.include_object)``.
    """
    schema = getattr(obj, "schema", None)
    if schema is None and hasattr(obj, "table"):
        schema = getattr(obj.table, "schema", None)
    if type_ == "table" and name == VERSION_TABLE:
        return False
    return schema != SCHEMA
