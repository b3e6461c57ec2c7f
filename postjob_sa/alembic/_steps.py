"""Steps the revisions share. Revisions are frozen history: change nothing here that a landed
revision uses; add a new function instead."""

from __future__ import annotations

from alembic import op
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text


def _external(ctx: MigrationContext) -> bool:
    """Whether the migration runs inside a transaction the caller began itself (Alembic's
    "share a connection" recipe, ``engine.begin()``): then nothing can run outside it."""
    return (not ctx.as_sql and ctx.connection is not None and ctx.connection.in_transaction()
            and getattr(ctx, "_transaction", None) is None)


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


def own_transaction(sql: str, *, then_wait: float = 0.0) -> None:
    """Run ``sql`` in a transaction of its own, committed before the steps that follow, then
    wait ``then_wait`` seconds (calls that began before it end meanwhile). Inside a
    transaction the caller began, in place, without the wait."""
    ctx = op.get_context()
    if _external(ctx):
        op.execute(sql)
        return
    with ctx.autocommit_block():
        op.execute("BEGIN;\n" + sql + "\nCOMMIT;")
        if then_wait > 0:
            op.execute(text("SELECT pg_sleep(:seconds)").bindparams(seconds=float(then_wait)))
