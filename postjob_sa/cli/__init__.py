"""The ``postjob`` command line: wiring (this package's command modules) kept apart from
rendering (``_render``), data access (``_query``, ``_statements``) and error mapping
(``_errors``). ``main`` is the console script."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence

import click

from ._env import App
from ._errors import run_guarded
from ._logging import configure_logging

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.option(
    "--database-url", metavar="URL",
    help="postgresql://, postgresql+psycopg:// or postgresql+psycopg2:// URL, as the app "
    "takes it. Default: $POSTJOB_DATABASE_URL, "
    "else $DATABASE_URL, else the embedded server (pip install 'postjob_sa[embedded]').",
)
@click.option("-v", "--verbose", count=True, help="-v: one log line per job; -vv: debug.")
@click.version_option(package_name="postjob_sa", prog_name="postjob")
@click.pass_context
def cli(ctx: click.Context, database_url: str | None, verbose: int) -> None:
    """postjob: a PostgreSQL job queue and restartable workflow engine."""
    app = ctx.ensure_object(App)
    app.explicit_url = database_url
    app.verbose = verbose
    configure_logging(verbose)


def _register() -> None:
    from . import db, demo, event, job, ps, queue, run, web

    cli.add_command(db.db)
    cli.add_command(job.job)
    cli.add_command(event.event)
    cli.add_command(ps.ps)
    cli.add_command(queue.queue)
    cli.add_command(queue.schedules)
    cli.add_command(run.run)
    cli.add_command(run.reap)
    cli.add_command(demo.demo)
    cli.add_command(web.web)


_register()


def main(argv: Sequence[str] | None = None) -> None:
    """The console script ``postjob``."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")  # pgserver's, not ours
    app = App()
    code = run_guarded(
        lambda: cli.main(
            args=list(argv) if argv is not None else None, prog_name="postjob",
            standalone_mode=False, obj=app,
        ),
        app,
    )
    sys.exit(code)
