"""``postjob db``: apply, inspect and undo the package's schema revisions; grant a role what
a worker and an enqueuing application need."""

from __future__ import annotations

import os
from argparse import Namespace
from pathlib import Path
from typing import Any

import click

from postjob_sa import _alembic_quiet  # noqa: F401  (first: Alembic imported quietly)

# isort: split
from alembic.config import Config

from postjob_sa._db import DRIVER_LABELS
from postjob_sa._host_history import HostWay, UpToDate, host_way, write_revision
from postjob_sa._migrations import (
    check_revision,
    head_revision,
    installed_revision,
    migrate,
    read_oldest_served,
    schema_manager,
)
from postjob_sa._migrations import downgrade as downgrade_schema
from postjob_sa.errors import InvalidArgument, SchemaError

from . import _statements as statements
from ._env import App
from ._render import print_json

#: PostgreSQL truncates identifiers to NAMEDATALEN - 1 bytes.
MAX_ROLE_BYTES = 63


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


MANAGERS = {"postjob": "by postjob db migrate", "alembic": "by your app's Alembic migrations"}
#: What brings a missing or older schema up, by who manages it (None: nobody yet).
UPGRADE_HINTS = {
    "postjob": "postjob db migrate",
    "alembic": "postjob db revision, then alembic upgrade head",
    None: "postjob db migrate, or in an app whose Alembic migrations install it: "
          "postjob db revision, then alembic upgrade head",
}


def _upgrade_hint(manager: str | None, host: HostWay | None, head: str) -> str:
    """The command that brings the schema up: the app's own upgrade where its Alembic history
    carries our schema (``host``: read from its alembic.ini), else by who manages it."""
    if host is not None and host.way == "branch":
        return "alembic upgrade heads"
    if host is not None and host.way == "single":
        return ("alembic upgrade head" if host.applies == head
                else "postjob db revision, then alembic upgrade head")
    return UPGRADE_HINTS[manager]


def _host(alembic_ini: str | None) -> HostWay | None:
    """How the app's Alembic history (``--alembic-ini``, else ./alembic.ini if there is one)
    carries our schema; None without one (or, unasked, one that cannot be read)."""
    ini = Path(alembic_ini or "alembic.ini")
    if alembic_ini is None and not ini.is_file():
        return None
    try:
        return host_way(_host_config(ini, None))
    except Exception:
        if alembic_ini is not None:
            raise
        return None


@db.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@click.option("--alembic-ini", metavar="PATH",
              help="Your app's Alembic configuration, to name the command that upgrades the "
              "schema where its history carries it. [default: alembic.ini, if there is one]")
@click.pass_obj
def db_status(app: App, as_json: bool, alembic_ini: str | None) -> None:
    """Show the installed revision next to the newest one this code has, what manages it,
    and what to run when it is missing or behind."""
    host = _host(alembic_ini)
    with app.engine.connect() as conn:
        installed, manager = installed_revision(conn), schema_manager(conn)
        oldest_served = read_oldest_served(lambda sql: conn.exec_driver_sql(sql).scalar())
    head = head_revision()
    state = _state(installed, oldest_served, head)
    driver = str(app.engine.dialect.driver)
    run = None if state in STATE_HINTS else _upgrade_hint(manager, host, head)
    if as_json:
        print_json({"database": app.display_url(), "driver": driver, "installed": installed,
                    "head": head, "state": state, "managed_by": manager, "run": run})
        return
    click.echo(f"database:  {app.display_url()} ({app.source})")
    click.echo(f"driver:    {DRIVER_LABELS[driver]}")
    click.echo(f"installed: {installed or '-'}")
    click.echo(f"head:      {head}")
    if manager is not None:
        click.echo(f"managed:   {MANAGERS[manager]}")
    hint = STATE_HINTS[state] if run is None else f"  (run: {run})"
    click.echo(f"state:     {state}{hint}")


#: A schema newer than this code: workers of this code keep working on it while it serves them.
STATE_HINTS = {
    "up to date": "",
    "newer": "  (it still serves this code: upgrade postjob_sa where this runs when you can)",
    "too new": "  (it no longer serves this code: upgrade postjob_sa where this runs)",
}


def _state(installed: str | None, oldest_served: str | None, head: str) -> str:
    if installed is None:
        return "missing"
    if installed == head:
        return "up to date"
    if installed < head:
        return "behind"
    try:
        check_revision(installed, oldest_served)
    except SchemaError:
        return "too new"
    return "newer"


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


@db.command("revision")
@click.option("--alembic-ini", metavar="PATH",
              help="Your app's Alembic configuration. [default: alembic.ini, or DIR/alembic.ini "
              "with --directory]")
@click.option("-d", "--directory", metavar="DIR",
              help="Your migrations directory, when the configuration does not name it "
              "(Flask-Migrate's migrations/: its alembic.ini has no script_location). Default: "
              "the folder of such an alembic.ini.")
@click.option("--to", "to", metavar="REV", help="Our revision to upgrade to (default: the newest).")
@click.option("-m", "--message", help='The revision\'s message (default: "postjob schema REV").')
@click.option("--rev-id", metavar="ID", help="The new revision's id (default: Alembic makes one).")
def db_revision(alembic_ini: str | None, directory: str | None, to: str | None,
                message: str | None, rev_id: str | None) -> None:
    """Write a revision into your app's Alembic history that installs or upgrades the postjob
    schema (the single-head way: `alembic upgrade head`, or `flask db upgrade`, then applies
    it). Needs no database."""
    ini = Path(alembic_ini) if alembic_ini else Path(directory or ".") / "alembic.ini"
    written = write_revision(_host_config(ini, directory), to=to, message=message, rev_id=rev_id)
    if isinstance(written, UpToDate):  # success: it runs again and again in CI and Makefiles
        click.echo(
            f"nothing to write: your history already applies the postjob schema up to "
            f"{written.before} (revision {written.where}); apply it with `alembic upgrade head`")
        return
    try:
        shown = os.path.relpath(written.path)
    except ValueError:  # another drive (Windows)
        shown = str(written.path)
    click.echo(
        f"wrote {shown}: postjob schema {written.before or 'nothing'} -> {written.to}, "
        f"after your revision {written.down_revision or '(none: it starts your history)'}; "
        "apply it with `alembic upgrade head`"
    )


def _host_config(ini: Path, directory: str | None) -> Config:
    """The Alembic configuration of the app at ``ini`` (its migrations in ``directory``, when
    the configuration does not name them)."""
    if not ini.is_file():
        raise InvalidArgument(f"no Alembic configuration at {ini} (name yours with --alembic-ini)")
    cfg = Config(str(ini), cmd_opts=Namespace(quiet=True))  # we say what we wrote
    if directory is not None:
        if not Path(directory).is_dir():
            raise InvalidArgument(f"no migrations directory at {directory}")
        cfg.set_main_option("script_location", directory)
    elif cfg.get_main_option("script_location") is None:
        # Flask-Migrate sets it in code, to the folder that holds this alembic.ini
        cfg.set_main_option("script_location", str(ini.resolve().parent))
    else:
        _find_scripts(cfg, ini)
    return cfg


def _find_scripts(cfg: Config, ini: Path) -> None:
    """A relative ``script_location`` is read from the ini's folder (where ``alembic`` run
    beside it finds it), else from the current one (Alembic's own reading). Where neither has
    it (a framework that sets it in code, as Advanced Alchemy does), InvalidArgument."""
    location = cfg.get_main_option("script_location") or ""
    path = Path(location)
    if ":" in location and not path.is_absolute():
        return  # package:folder, which Alembic finds among the installed packages
    beside = ini.resolve().parent / path
    if not path.is_absolute() and beside.is_dir():
        cfg.set_main_option("script_location", str(beside).replace("%", "%%"))
    elif not path.is_dir():
        raise InvalidArgument(
            f"no Alembic scripts at {location} (script_location of {ini}, read from its "
            "folder and from the current one): pass your migrations folder with --directory DIR")


def _role_name(role: str) -> str:
    if not role or not role.strip():
        raise InvalidArgument("the role name must not be empty")
    if "\x00" in role:
        raise InvalidArgument(f"not a role name: {role!r} (it contains a NUL character)")
    if len(role.encode()) > MAX_ROLE_BYTES:
        raise InvalidArgument(f"not a role name: {role!r} (longer than {MAX_ROLE_BYTES} bytes)")
    return role


@db.command("grant")
@click.argument("role")
@click.pass_obj
def db_grant(app: App, role: str) -> None:
    """Grant ROLE exactly what a worker and an enqueuing application need (usage of the schema,
    execute on its functions, read/write on its tables, usage of its sequences; no DDL).
    Run it as the schema's owner, again after every migrate."""
    name = _role_name(role)
    with app.connect_checked() as conn:
        superuser = conn.execute(statements.ROLE_EXISTS, {"name": name}).scalar()
        if superuser is None:
            raise InvalidArgument(f"no role named {name!r} in this database cluster "
                                  "(create the role first, with LOGIN)")
        quoted, grants = conn.execute(statements.ROLE_GRANTS, {"role": name}).one()
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        # The statements come from the server with the role quoted in them; they run without
        # parameters, so neither driver reads a '%' in the role's name as a placeholder.
        cur: Any = dbapi.cursor()
        try:
            for statement in grants:
                cur.execute(statement)
        finally:
            cur.close()
        conn.commit()
    for line in grants:
        click.echo(line)
    note = " (a superuser: it needs no grants)" if superuser else ""
    click.echo(f"granted to {quoted} on {app.display_url()}{note}")
