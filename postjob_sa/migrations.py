"""postjob_sa's schema steps inside your own Alembic history: the single-head way.

A revision of yours applies our schema up to a named revision; ``alembic upgrade head`` stays
one head. ``postjob db revision`` writes such a revision::

    from postjob_sa import migrations

    def upgrade() -> None:
        migrations.upgrade(to="pj0001")

    def downgrade() -> None:
        migrations.downgrade(to=None)

Both run the package's own revision modules, in order, on the connection of your migration.
The database says where to start (``postjob.schema_version()``), so a call that finds its
work done does nothing. In offline mode (``alembic upgrade --sql``) there is no database to
ask: the start is what your history applied up to the revision the range starts from.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator

from postjob_sa import _alembic_quiet  # noqa: F401  (first: Alembic imported quietly)

# isort: split
from alembic import context, op
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError

from postjob_sa import _host_history
from postjob_sa._asyncpg_scripts import scripts_sent_whole
from postjob_sa._migrations import (
    DROP_VERSION_TABLE_SQL,
    _standalone_heads,
    installed_revision,
    revisions,
    scripts,
    unfinished_jobs,
)
from postjob_sa.errors import InvalidArgument, PostjobError, SchemaError

__all__ = ["downgrade", "upgrade"]

# offline runs: where each run's SQL has brought the schema so far
_OFFLINE: weakref.WeakKeyDictionary[MigrationContext, str | None] = weakref.WeakKeyDictionary()


def upgrade(to: str) -> None:
    """Apply the package's revisions after the installed one, up to and including ``to``.

    Call it from the ``upgrade()`` of a revision in your history. ``to`` names a revision
    (``"pj0001"``), never ``head``: your revision must mean the same schema after you upgrade
    postjob_sa. Raises :class:`~postjob_sa.InvalidArgument` for a revision this package does
    not have, :class:`~postjob_sa.SchemaError` if the schema is already newer than ``to``.
    A schema that ``postjob db migrate`` installed is taken over by the first revision of
    yours that reaches it: its version table goes there; the revisions of yours before that
    one find the schema further already and change nothing.
    """
    target = _index(to, "upgrade")
    ctx = _context("upgrade")
    start = _start(ctx)
    if start > target and not ctx.as_sql and _standalone_heads(op.get_bind()):
        # `postjob db migrate` brought the schema further than this revision of yours: a later
        # one of yours reaches it and takes it over
        return
    if start > target:
        raise SchemaError(
            f"the postjob schema is at {revisions()[start]}, newer than {to}: "
            "a revision of yours upgrades it to an older revision than the database has"
        )
    with _sending(ctx):
        for script in scripts()[start + 1 : target + 1]:
            script.module.upgrade()
    op.execute(DROP_VERSION_TABLE_SQL)  # a schema `postjob db migrate` installed is now yours
    _OFFLINE[ctx] = to


def downgrade(to: str | None) -> None:
    """Undo the package's revisions newer than ``to``; ``None`` drops the schema, and every
    job in it.

    Call it from the ``downgrade()`` of the revision that upgraded from ``to``. Raises
    :class:`~postjob_sa.SchemaError` if the schema is already older than ``to``. Dropping the
    schema while unfinished jobs are in it is refused (a ``CommandError``, which Alembic's
    command line prints as one line) unless the downgrade is run with ``-x
    postjob_drop_unfinished=yes`` or ``POSTJOB_DROP_UNFINISHED=yes`` in the environment.
    """
    target = -1 if to is None else _index(to, "downgrade")
    ctx = _context("downgrade")
    start = _start(ctx)
    if start < target:
        installed = "not installed" if start < 0 else f"at {revisions()[start]}"
        raise SchemaError(f"the postjob schema is {installed}, older than {to}: nothing to downgrade")
    if target < 0 <= start and not ctx.as_sql:
        _refuse_dropping_unfinished()
    with _sending(ctx):
        for script in reversed(scripts()[target + 1 : start + 1]):
            script.module.downgrade()
    _OFFLINE[ctx] = to


@contextlib.contextmanager
def _sending(ctx: MigrationContext) -> Iterator[None]:
    """Online, our revisions' scripts of many statements go whole (asyncpg prepares each
    statement otherwise, and refuses them)."""
    if ctx.as_sql:
        yield
        return
    with scripts_sent_whole(op.get_bind()):
        yield


#: The -x argument and the environment variable that let a downgrade drop unfinished jobs.
DROP_UNFINISHED_X = "postjob_drop_unfinished"
DROP_UNFINISHED_ENV = "POSTJOB_DROP_UNFINISHED"
_YES = ("yes", "true", "1")


def _refuse_dropping_unfinished() -> None:
    """Before the schema is dropped: a CommandError (nothing done; the migration's
    transaction rolls back) while unfinished jobs are in it, unless told to drop them."""
    count = unfinished_jobs(op.get_bind())
    if not count or _told_to_drop():
        return
    raise CommandError(
        f"refusing to drop the postjob schema: {count} unfinished job(s) (ready, processing, "
        "sleep or err) would be dropped with it. Let them finish or cancel them (postjob job "
        f"cancel ID), or drop them too: downgrade with -x {DROP_UNFINISHED_X}=yes (alembic -x "
        f"{DROP_UNFINISHED_X}=yes downgrade ...), or with {DROP_UNFINISHED_ENV}=yes in the "
        "environment"
    )


def _told_to_drop() -> bool:
    try:
        x = context.get_x_argument(as_dictionary=True).get(DROP_UNFINISHED_X)
    except (NameError, AttributeError):  # run outside Alembic's command (no -x to read)
        x = None
    return any((value or "").strip().lower() in _YES
               for value in (x, os.environ.get(DROP_UNFINISHED_ENV)))


def _index(rev: str, what: str) -> int:
    known = revisions()
    if rev not in known:
        raise InvalidArgument(
            f"postjob_sa.migrations.{what}: unknown revision {rev!r} "
            f"(this postjob_sa has {', '.join(known)}; name one, never 'head')"
        )
    return known.index(rev)


def _context(what: str) -> MigrationContext:
    try:
        ctx = op.get_context()
    except (NameError, AttributeError):  # no proxy yet / the last one was torn down
        raise PostjobError(
            f"postjob_sa.migrations.{what}() runs inside an Alembic revision of your app; "
            "outside Alembic, use postjob_sa.migrate(engine)"
        ) from None
    _check_offline_paramstyle(ctx)
    return ctx


def _check_offline_paramstyle(ctx: MigrationContext) -> None:
    """Offline SQL renders our functions with the dialect's paramstyle: with psycopg's own
    (pyformat), every % in them comes out as %% and the script installs broken functions. A
    CommandError: Alembic's and Flask-Migrate's commands print it as one line."""
    paramstyle = ctx.dialect.paramstyle
    if ctx.as_sql and paramstyle in ("format", "pyformat"):
        raise CommandError(
            f"offline SQL (--sql) with the paramstyle {paramstyle!r} writes every % in "
            "postjob's functions as %%: pass dialect_opts={\"paramstyle\": \"named\"} to "
            "context.configure() in run_migrations_offline() of your env.py")


def _start(ctx: MigrationContext) -> int:
    """The index of the installed revision (-1: none)."""
    if ctx.as_sql:
        installed = _OFFLINE[ctx] if ctx in _OFFLINE else _host_history.applied_before_offline(ctx)
    else:
        installed = installed_revision(op.get_bind())
    if installed is None:
        return -1
    if installed not in revisions():
        raise SchemaError(
            f"the postjob schema is at {installed}, a revision this postjob_sa does not have: "
            "upgrade postjob_sa"
        )
    return revisions().index(installed)
