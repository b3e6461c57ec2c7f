"""Steps the revisions share. Revisions are frozen history: change nothing here that a landed
revision uses; add a new function instead."""

from __future__ import annotations

from alembic import op


def index_step(*statements: str) -> None:
    """Build or drop indexes CONCURRENTLY (writes go on meanwhile) when Alembic owns the
    transaction; inside a transaction the caller began itself (Alembic's "share a connection"
    recipe, ``engine.begin()``), where nothing can run outside it, in place instead."""
    ctx = op.get_context()
    external = (not ctx.as_sql and ctx.connection is not None and ctx.connection.in_transaction()
                and getattr(ctx, "_transaction", None) is None)
    if external:
        for statement in statements:
            op.execute(statement.replace(" CONCURRENTLY", ""))
        return
    with ctx.autocommit_block():
        for statement in statements:
            op.execute(statement)
