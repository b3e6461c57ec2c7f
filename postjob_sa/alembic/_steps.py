"""Steps the revisions share. Revisions are frozen history: change nothing here that a landed
revision uses (how its SQL is sent may change, never what it sends); add a new function
instead. On asyncpg, scripts of many statements go unprepared: the steps here do it for what
they run, :func:`sends_scripts_whole` for a revision that runs a script with ``op.execute()``."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import ParamSpec

from alembic import op
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from postjob_sa._asyncpg_scripts import scripts_sent_whole


def _external(ctx: MigrationContext) -> bool:
    """Whether the migration runs inside a transaction the caller began itself (Alembic's
    "share a connection" recipe, ``engine.begin()``): then nothing can run outside it."""
    return (not ctx.as_sql and ctx.connection is not None and ctx.connection.in_transaction()
            and getattr(ctx, "_transaction", None) is None)


@contextlib.contextmanager
def _whole() -> Iterator[None]:
    """Online, scripts of many statements run in the block go to asyncpg unprepared, whole
    (:mod:`postjob_sa._asyncpg_scripts`); offline SQL and other drivers are left as they are."""
    if op.get_context().as_sql:
        yield
        return
    with scripts_sent_whole(op.get_bind()):
        yield


_P = ParamSpec("_P")


def sends_scripts_whole(step: Callable[_P, None]) -> Callable[_P, None]:
    """For a revision's ``upgrade()`` or ``downgrade()`` (and the steps here) that runs
    scripts of many statements with ``op.execute()``: on asyncpg, which prepares every
    statement and refuses such a script, they are sent unprepared, whichever env.py runs the
    revision (the branch way's included). The SQL, and so ``alembic upgrade --sql``, stays
    the same."""

    @functools.wraps(step)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> None:
        with _whole():
            step(*args, **kwargs)

    return run


@sends_scripts_whole
def index_step(*statements: str) -> None:
    """Build or drop indexes CONCURRENTLY (writes go on meanwhile) when Alembic owns the
    transaction; inside a transaction the caller began, in place instead."""
    ctx = op.get_context()
    if _external(ctx):
        for statement in statements:
            op.execute(statement.replace(" CONCURRENTLY", ""))
        return
    with ctx.autocommit_block():
        for statement in statements:
            op.execute(statement)


@sends_scripts_whole
def own_transaction(sql: str, *, then_wait: float = 0.0) -> None:
    """Run ``sql`` in a transaction of its own, committed before the steps that follow, then
    wait ``then_wait`` seconds (calls that began before it end meanwhile). Inside a
    transaction the caller began, in place, without the wait."""
    ctx = op.get_context()
    if _external(ctx):
        op.execute(sql)
        return
    with ctx.autocommit_block():
        try:
            op.execute("BEGIN;\n" + sql + "\nCOMMIT;")
        except DBAPIError:
            # the transaction the failed string began is still open, and aborted: end it here,
            # before the block's end asks the connection anything (psycopg2 would fail there)
            op.execute("ROLLBACK")
            raise
        if then_wait > 0:
            op.execute(text("SELECT pg_sleep(:seconds)").bindparams(seconds=float(then_wait)))


#: The SQLSTATEs of a transaction that met another one in its way: a deadlock, a lock not had
#: within lock_timeout.
_IN_THE_WAY = {"40P01", "55P03"}


@sends_scripts_whole
def own_transaction_retried(sql: str, *, then_wait: float = 0.0, tries: int = 5) -> None:
    """:func:`own_transaction` tried again (after a growing pause) when a deadlock or the lock
    timeout ends it: a transaction that takes a table's lock beside running workers may meet
    one of theirs that waits for it in turn. Offline, and inside a transaction the caller began,
    as :func:`own_transaction`."""
    ctx = op.get_context()
    if ctx.as_sql or _external(ctx):
        own_transaction(sql, then_wait=then_wait)
        return
    for attempt in range(1, tries + 1):
        try:
            own_transaction(sql, then_wait=then_wait)
            return
        except DBAPIError as exc:
            state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            if state not in _IN_THE_WAY or attempt == tries:
                raise
            with ctx.autocommit_block():
                op.execute("ROLLBACK")
            time.sleep(0.2 * attempt)
