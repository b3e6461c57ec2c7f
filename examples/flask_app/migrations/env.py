"""Alembic environment of the example app: its own tables; postjob_sa's stay out of
autogenerate (its revisions, not our models, own the ``postjob`` schema)."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine

import postjob_sa
from examples.flask_app.config import database_url
from examples.flask_app.models import Base

config = context.config

# docs: begin configure
OPTIONS: dict[str, Any] = {
    "target_metadata": Base.metadata,
    # compare the app's tables only; without this, autogenerate would propose dropping
    # the postjob schema's tables, which our metadata does not describe
    "include_schemas": True,
    "include_object": postjob_sa.include_object,
    # one transaction per revision: a postjob_sa revision that builds an index
    # CONCURRENTLY commits what came before it
    "transaction_per_migration": True,
}
# docs: end configure


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:  # handed in by a caller (tests, a management command)
        context.configure(connection=connection, **OPTIONS)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(database_url())
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, **OPTIONS)
            with context.begin_transaction():
                context.run_migrations()
    finally:  # a failed migration too: psycopg 3 warns of a connection left open
        engine.dispose()


def run_migrations_offline() -> None:
    # paramstyle "named": a '%' in our SQL stays one '%' in the script (not '%%')
    context.configure(
        url=database_url(), literal_binds=True, dialect_opts={"paramstyle": "named"}, **OPTIONS
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
