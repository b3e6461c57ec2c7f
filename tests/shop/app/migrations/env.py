"""The shop's Alembic environment: its own tables, compared by autogenerate; postjob_sa's
schema is installed by a revision of the shop's history and left out of the comparison."""

from __future__ import annotations

import os
from typing import Any

from alembic import context
from sqlalchemy import create_engine

import postjob_sa
from tests.shop.app.models import Base

config = context.config

# docs: begin configure
OPTIONS: dict[str, Any] = {
    "target_metadata": Base.metadata,
    # autogenerate looks at every schema, then include_object leaves postjob's out:
    # its tables are not in Base.metadata, and dropping them is not what you want
    "include_schemas": True,
    "include_object": postjob_sa.include_object,
    # one transaction per revision: a postjob_sa revision that builds an index
    # CONCURRENTLY commits what came before it
    "transaction_per_migration": True,
}
# docs: end configure

if context.get_x_argument(as_dictionary=True).get("compare") == "postjob":
    # the other way: compare postjob's schema too (our revisions and models agree)
    OPTIONS.update(target_metadata=[Base.metadata, postjob_sa.metadata],
                   include_object=postjob_sa.include_postjob_schema)


def run_migrations_online() -> None:
    engine = create_engine(os.environ["DATABASE_URL"])
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
        url=os.environ["DATABASE_URL"],
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **OPTIONS,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
