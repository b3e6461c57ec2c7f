"""The one place where exceptions become exit statuses and one-line messages.

Bad input (unknown id or token, malformed option, unreachable database, missing schema,
missing privileges, …) prints ``postjob: <message>`` on stderr and exits with status 2; Ctrl-C exits with 130;
anything else is a bug: one line too (the traceback with ``-v``) and status 1.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

import click
from sqlalchemy.exc import DBAPIError, OperationalError

from postjob_sa._db import sqlstate
from postjob_sa.embedded import EmbeddedUnavailable
from postjob_sa.errors import InvalidArgument, InvalidJobState, JobNotFound, SchemaError

from ._env import App

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
#: SQLSTATE insufficient_privilege (either driver)
INSUFFICIENT_PRIVILEGE = "42501"
_INPUT_ERRORS = (InvalidArgument, JobNotFound, InvalidJobState, SchemaError, EmbeddedUnavailable)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _alembic_command_error(exc: BaseException) -> bool:
    """An Alembic CommandError (Alembic is imported only by the commands that use it)."""
    module = sys.modules.get("alembic.util.exc")
    return module is not None and isinstance(exc, module.CommandError)


def describe(exc: BaseException, app: App) -> tuple[int, str]:
    """(exit status, message) for an exception that escaped a command."""
    if isinstance(exc, _INPUT_ERRORS):
        return EXIT_BAD_INPUT, str(exc)
    if isinstance(exc, click.UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else "postjob"
        return EXIT_BAD_INPUT, f"{exc.format_message()} (see {where} --help)"
    if isinstance(exc, click.ClickException):
        return EXIT_BAD_INPUT, exc.format_message()
    if _alembic_command_error(exc):
        return EXIT_BAD_INPUT, f"migration: {exc}"
    if isinstance(exc, OperationalError):
        where = app.display_url() if app._url is not None else "the database"
        return EXIT_BAD_INPUT, f"cannot use the database {where}: {_first_line(exc)}"
    if isinstance(exc, DBAPIError) and sqlstate(exc) == INSUFFICIENT_PRIVILEGE:
        return EXIT_BAD_INPUT, (f"{_first_line(exc)} (the schema's owner grants a role what "
                                "workers and applications need with: postjob db grant ROLE)")
    if isinstance(exc, DBAPIError):
        return 1, f"database error: {_first_line(exc)}"
    return 1, f"internal error: {type(exc).__name__}: {exc}"


def run_guarded(invoke: Callable[[], int | None], app: App) -> int:
    """Invoke the command line, turning every exception into an exit status."""
    try:
        code = invoke()
        return int(code or 0)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except (KeyboardInterrupt, click.Abort):
        click.echo("postjob: interrupted", err=True)
        return EXIT_INTERRUPTED
    except Exception as exc:
        status, message = describe(exc, app)
        if status != EXIT_BAD_INPUT and app.verbose:
            click.echo(app.redact(traceback.format_exc()), err=True, nl=False)
        click.echo(f"postjob: {app.redact(_one_line(message))}", err=True)
        return status
    finally:
        try:
            app.dispose()
        except Exception:  # the database went away meanwhile: nothing to release
            pass
        sys.stdout.flush()
