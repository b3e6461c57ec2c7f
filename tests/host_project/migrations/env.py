"""The host's env.py: its own metadata, our objects left alone by autogenerate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

import postjob_sa
from tests.host_project.models import HostBase

config = context.config
# "mine" compares only the host's tables; "both" compares the host's and postjob's
MODE = config.attributes.get("metadata_mode", "mine")

if MODE == "both":
    target_metadata = [HostBase.metadata, postjob_sa.metadata]
    include_object = None
else:
    target_metadata = [HostBase.metadata]
    include_object = postjob_sa.include_object


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
        connection = engine.connect()
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_schemas=True,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
