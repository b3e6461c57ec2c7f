"""Applying the package's Alembic revisions, standalone or inside a host project.

Alembic is imported by the functions that run it, not by this module: checking a schema's
revision (every worker start, ``postjob ps``) needs none of it, and importing it costs more
than the rest of postjob_sa (about a second of ``postjob --help`` on a busy machine).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError

from postjob_sa import _sql
from postjob_sa._db import sqlstate
from postjob_sa.errors import SchemaError
from postjob_sa.models import SCHEMA

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import Script
    from sqlalchemy.ext.asyncio import AsyncEngine

ALEMBIC_DIR = Path(__file__).parent / "alembic"
VERSIONS_DIR = ALEMBIC_DIR / "versions"
#: Where ``alembic.ini`` of a host project finds our revisions (``version_locations``).
VERSION_LOCATION = "postjob_sa:alembic/versions"
#: The version table of standalone migrations (hosts keep their own alembic_version).
VERSION_TABLE = "postjob_alembic_version"
#: A host's history that takes the schema over drops the standalone version table.
DROP_VERSION_TABLE_SQL = "DROP TABLE IF EXISTS postjob_alembic_version"
MIGRATE_HINT = (
    "run `postjob db migrate`, or in an app whose Alembic migrations install it, "
    "`alembic upgrade head` (after `postjob db revision` when postjob_sa was upgraded)"
)
#: What :func:`migrate` says when a host's Alembic history installed the schema.
HOST_MANAGED = (
    "the postjob schema in this database is managed by your app's Alembic migrations "
    f"(there is no {VERSION_TABLE} table): "
)

Bind = Engine | Connection | str
P = ParamSpec("P")
R = TypeVar("R")


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


def _quiet_alembic() -> None:
    """Before a function here imports Alembic: the first import is a quiet one."""
    from postjob_sa import _alembic_quiet  # noqa: F401


def _config(connection: Connection) -> Config:
    _quiet_alembic()
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", str(VERSIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def _scripts() -> tuple[Script, ...]:
    _quiet_alembic()
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.set_main_option("path_separator", "os")
    newest_first = ScriptDirectory.from_config(cfg).walk_revisions()
    return tuple(reversed(list(newest_first)))


def scripts() -> tuple[Script, ...]:
    """The package's revisions, oldest first (one line of history: branch ``postjob``)."""
    return _scripts()


def revisions() -> list[str]:
    """The ids of the package's revisions, oldest first (as :func:`scripts` has them)."""
    return [s.revision for s in _scripts()]


_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


@functools.cache
def revision_ids() -> tuple[str, ...]:
    """The ids of the package's revisions, oldest first, read from the revision files' own
    ``revision = ...`` and ``down_revision = ...`` lines: what Alembic's walk of the same files
    finds (a test holds them equal), without importing Alembic and every revision."""
    parent: dict[str, str | None] = {}
    for path in VERSIONS_DIR.glob("*.py"):
        found = dict(_REVISION_LINE.findall(path.read_text()))
        if "revision" in found:
            parent[ast.literal_eval(found["revision"])] = ast.literal_eval(found.get("down_revision", "None"))
    child = {down: rev for rev, down in parent.items()}
    chain: list[str] = []
    rev: str | None = None
    while rev in child:
        rev = child[rev]
        chain.append(rev)
    if len(chain) != len(parent):
        raise SchemaError(f"the revisions in {VERSIONS_DIR} are not one line of history")
    return tuple(chain)


def head_revision() -> str:
    """The newest revision of the ``postjob`` branch shipped with this package."""
    return revision_ids()[-1]


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


def unfinished_jobs(conn: Connection) -> int:
    """How many jobs of the installed schema are unfinished (see JOBS_UNFINISHED_COUNT)."""
    return int(conn.exec_driver_sql(_sql.JOBS_UNFINISHED_COUNT).scalar_one())


def _standalone_heads(conn: Connection) -> tuple[str, ...]:
    _quiet_alembic()
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_heads()


def schema_manager(conn: Connection) -> str | None:
    """Who keeps the installed schema's history: ``"postjob"`` (:func:`migrate`, in the
    version table ``postjob_alembic_version``), ``"alembic"`` (a host's Alembic history,
    either way: our branch in its version table, or a revision that calls
    :mod:`postjob_sa.migrations`), or None when no schema is installed."""
    if installed_revision(conn) is None:
        return None
    return "postjob" if _standalone_heads(conn) else "alembic"


def _own_history(conn: Connection, action: str) -> None:
    """Refuse a schema a host's Alembic manages (a second version table would fork its
    history); forget a standalone history whose schema was dropped behind our back."""
    manager = schema_manager(conn)
    if manager == "alembic":
        raise SchemaError(HOST_MANAGED + action)
    if manager is None and _standalone_heads(conn):
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        ctx.stamp(ScriptDirectory.from_config(_config(conn)), "base")


def migrate(bind: Bind | AsyncEngine, revision: str = "heads") -> None:
    """Bring the ``postjob`` schema to the newest revision; idempotent.

    ``bind`` is an Engine, a Connection (the caller commits) or a database URL; an
    ``AsyncEngine`` or a ``postgresql+asyncpg://`` URL too (on connections of its own, in a
    loop of its own: it may be called inside the app's running loop). Raises
    :class:`SchemaError` on a database whose schema a host's Alembic migrations installed:
    there, run ``alembic upgrade head``.
    """
    _apply(bind, "upgrade", revision,
           "run your `alembic upgrade head` (`heads` on the branch way) instead")


def downgrade(bind: Bind | AsyncEngine, revision: str = "base") -> None:
    """Downgrade the ``postjob`` schema; ``base`` drops the schema and every job in it.

    It takes what :func:`migrate` takes, and leaves a schema that a host's Alembic manages
    alone.
    """
    _apply(bind, "downgrade", revision, "downgrade it with your `alembic downgrade`")


def _apply(bind: Bind | AsyncEngine, command: str, revision: str, instead: str) -> None:
    from postjob_sa import _async_bind

    if _async_bind.is_async(bind):
        _async_bind.run_on_connection(cast("AsyncEngine | str", bind),
                                      lambda conn: _apply_on(conn, True, command, revision, instead))
        return
    with _connection(cast(Bind, bind)) as conn:
        _apply_on(conn, conn is not bind, command, revision, instead)


def _apply_on(conn: Connection, owned: bool, command: str, revision: str, instead: str) -> None:
    _own_history(conn, instead)
    if owned and conn.in_transaction():
        # end the transaction our checks began on a connection of ours, so that Alembic owns
        # the transactions of the run: a revision's autocommit block (CREATE INDEX
        # CONCURRENTLY) needs that. A caller's connection is the caller's to commit.
        conn.commit()
    config = _config(conn)
    from alembic import command as commands

    from postjob_sa._asyncpg_scripts import scripts_sent_whole

    with scripts_sent_whole(conn):
        getattr(commands, command)(config, revision)


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


#: SQLSTATEs of a statement that met no postjob schema (invalid_schema_name, undefined_table),
#: or one older than the code (undefined_function).
_SCHEMA_MISSING_STATES = ("3F000", "42P01")
_SCHEMA_OLD_STATES = ("42883",)


def schema_error(exc: BaseException) -> SchemaError | None:
    """The SchemaError (with what to run) that a statement's error means, if it means one."""
    state = sqlstate(exc)
    if state not in _SCHEMA_MISSING_STATES + _SCHEMA_OLD_STATES or "postjob" not in str(exc):
        return None
    if state in _SCHEMA_MISSING_STATES:
        return SchemaError(f"the postjob schema is missing from this database: {MIGRATE_HINT}")
    return SchemaError(f"the postjob schema in this database is older than this code: {MIGRATE_HINT}")


def schema_checked(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate an API call: a statement that met no postjob schema (or an older one) raises
    the SchemaError of :func:`schema_error`, not the driver's UndefinedTable."""

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except DBAPIError as exc:
            error = schema_error(exc)
            if error is None:
                raise
            raise error from exc

    return checked


def check_schema(conn: Connection) -> None:
    """:func:`check_revision` of the schema this connection sees."""

    def scalar(sql: str) -> Any:
        return conn.exec_driver_sql(sql).scalar()

    check_revision(read_revision(scalar), read_oldest_served(scalar))


def _is_range(obj: Any, type_: str) -> bool:
    """A range of the job record (a partition the rotation made), its index, or a per-range
    copy PostgreSQL keeps of a foreign key to the record."""
    if type_ == "foreign_key_constraint":
        table = getattr(obj, "referred_table", None)
    elif type_ == "table":
        table = obj
    else:
        table = getattr(obj, "table", None)
    name = str(getattr(table, "name", ""))
    return getattr(table, "schema", None) == SCHEMA and (
        name.startswith("postjobs_from_") or name == "postjobs_default")


def include_postjob_schema(obj: Any, name: str | None, type_: str, reflected: bool,
                           compare_to: Any) -> bool:
    """For a host's env.py that compares our schema too (``target_metadata=[Base.metadata,
    postjob_sa.metadata]``): leaves out only what no model describes, the ranges of the job
    record that the rotation makes and drops, and the version table of ``postjob db migrate``.
    """
    if type_ == "table" and name == VERSION_TABLE:
        return False
    return not (reflected and _is_range(obj, type_))


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """For a host's env.py: keep autogenerate away from the ``postjob`` schema.

    Pass it as ``context.configure(include_object=postjob_sa.include_object)``.
    """
    schema = getattr(obj, "schema", None)
    if schema is None and hasattr(obj, "table"):
        schema = getattr(obj.table, "schema", None)
    if type_ == "table" and name == VERSION_TABLE:
        return False
    if reflected and _is_range(obj, type_):
        # a key to the job record is reflected once more per range of it (PostgreSQL keeps
        # one constraint per partition): the host's model names the record itself
        return False
    return schema != SCHEMA
