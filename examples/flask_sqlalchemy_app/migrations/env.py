"""Flask-Migrate's env.py (``flask db init``), with the three settings postjob_sa asks for:
autogenerate keeps to the app's tables, one transaction per revision, and offline SQL with the
named paramstyle."""

from __future__ import annotations

import logging
from logging.config import fileConfig
from typing import Any

from alembic import context
from flask import current_app

import postjob_sa

# this is the Alembic Config object, which provides
# access to the values within the .ini file in use.
config = context.config

# Interpret the config file for Python logging.
# This line sets up loggers basically.
fileConfig(config.config_file_name)  # type: ignore[arg-type]
logger = logging.getLogger('alembic.env')


def get_engine() -> Any:
    return current_app.extensions['migrate'].db.engine


def get_engine_url() -> str:
    return str(get_engine().url.render_as_string(hide_password=False).replace('%', '%%'))


config.set_main_option('sqlalchemy.url', get_engine_url())
target_db = current_app.extensions['migrate'].db

# docs: begin options
# what postjob_sa asks of an env.py (see docs/integrating.md)
POSTJOB_OPTIONS: dict[str, Any] = {
    # autogenerate compares the app's tables only: the postjob schema is our revisions'
    "include_schemas": True,
    "include_object": postjob_sa.include_object,
    # a postjob_sa revision that builds an index CONCURRENTLY commits what came before it
    "transaction_per_migration": True,
}
# docs: end options


def get_metadata() -> Any:
    if hasattr(target_db, 'metadatas'):
        return target_db.metadatas[None]
    return target_db.metadata


def run_migrations_offline() -> None:
    """Run migrations in 'offline' mode (``flask db upgrade --sql``)."""
    url = config.get_main_option("sqlalchemy.url")
    # docs: begin offline
    context.configure(
        url=url, target_metadata=get_metadata(), literal_binds=True,
        # a '%' in postjob_sa's functions stays one '%' in the script (not '%%')
        dialect_opts={"paramstyle": "named"}, **POSTJOB_OPTIONS,
    )
    # docs: end offline

    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations in 'online' mode."""

    # this callback is used to prevent an auto-migration from being generated
    # when there are no changes to the schema
    # reference: http://alembic.zzzcomputing.com/en/latest/cookbook.html
    def process_revision_directives(context: Any, revision: Any, directives: Any) -> None:
        if getattr(config.cmd_opts, 'autogenerate', False):
            script = directives[0]
            if script.upgrade_ops.is_empty():
                directives[:] = []
                logger.info('No changes in schema detected.')

    conf_args = current_app.extensions['migrate'].configure_args
    if conf_args.get("process_revision_directives") is None:
        conf_args["process_revision_directives"] = process_revision_directives

    connectable = get_engine()

    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=get_metadata(),
            **POSTJOB_OPTIONS,
            **conf_args
        )

        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
