"""``postjob db``: apply, inspect and undo the package's schema revisions."""

from __future__ import annotations

import click

from postjob_sa._migrations import downgrade as downgrade_schema
from postjob_sa._migrations import head_revision, installed_revision, migrate
from postjob_sa.errors import InvalidArgument

from ._env import App
from ._render import print_json


def _installed(app: App) -> str | None:
    with app.engine.connect() as conn:
        return installed_revision(conn)


@click.group()
def db() -> None:
    """Manage the postjob schema (Alembic branch "postjob")."""


@db.command("migrate")
@click.pass_obj
def db_migrate(app: App) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    before = _installed(app)
    migrate(app.engine)
    after = _installed(app)
    if before == after:
        click.echo(f"postjob schema is up to date at {after} ({app.display_url()})")
    else:
        click.echo(f"postjob schema migrated from {before or 'nothing'} to {after} ({app.display_url()})")


@db.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@click.pass_obj
def db_status(app: App, as_json: bool) -> None:
    """Show the installed revision next to the newest one this code has."""
    installed, head = _installed(app), head_revision()
    state = "up to date" if installed == head else "missing" if installed is None else "behind"
    if as_json:
        print_json({"database": app.display_url(), "installed": installed, "head": head, "state": state})
        return
    click.echo(f"database:  {app.display_url()} ({app.source})")
    click.echo(f"installed: {installed or '-'}")
    click.echo(f"head:      {head}")
    hint = {"missing": "  (run: postjob db migrate)", "behind": "  (run: postjob db migrate)"}
    click.echo(f"state:     {state}{hint.get(state, '')}")


@db.command("downgrade")
@click.argument("revision", default="base")
@click.pass_obj
def db_downgrade(app: App, revision: str) -> None:
    """Downgrade the schema to REVISION (default: base, which DROPS the schema and every job)."""
    before = _installed(app)
    if before is None:
        raise InvalidArgument("the postjob schema is not installed in this database: nothing to downgrade")
    downgrade_schema(app.engine, revision)
    after = _installed(app)
    what = "schema dropped" if after is None else f"now at {after}"
    click.echo(f"postjob schema downgraded from {before}: {what} ({app.display_url()})")
