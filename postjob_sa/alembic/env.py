"""Alembic environment used by :func:`postjob_sa.migrate` and ``postjob db``.

Host projects do not use this file: a revision of their own history calls
:mod:`postjob_sa.migrations`, or they add ``postjob_sa:alembic/versions`` to their
``version_locations``; either way their own env.py runs our revisions.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from postjob_sa._migrations import VERSION_TABLE


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("postjob_sa's alembic env needs a connection: use postjob_sa.migrate()")
_run(connection)
