"""The ``postjob`` command line: wiring (this package's command modules) kept apart from
rendering (``_render``), data access (``_query``, ``_statements``) and error mapping
(``_errors``). ``main`` is the console script.

A command's module is imported when the command runs, not before: ``postjob --help`` lists
them from :data:`COMMANDS`, and ``postjob ps`` imports neither the worker nor Alembic."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import click

from ._env import App
from ._errors import run_guarded
from ._logging import configure_logging

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Entry(NamedTuple):
    """Where a command is defined, and its summary for ``postjob --help`` (a test holds it
    equal to the command's own)."""

    module: str
    attr: str
    summary: str


COMMANDS = {
    "db": Entry("db", "db", 'Manage the postjob schema (Alembic branch "postjob").'),
    "demo": Entry("demo", "demo", "A tour: enqueue a fan-out/fan-in workflow with a manual "
                  "approval, run it, show it."),
    "event": Entry("event", "event", "Events that durable workflows wait for "
                   "(postjob_sa.wait_for_event)."),
    "history": Entry("history", "history", "History: ranges of job ids, retention "
                     "(see docs/operations.md)."),
    "job": Entry("job", "job", "Change jobs."),
    "ps": Entry("ps", "ps", "List root jobs newest first (with IDs: those jobs' trees)."),
    "queue": Entry("queue", "queue", "Per-queue limits, obeyed by every worker."),
    "reap": Entry("run", "reap", "Time out overdue jobs and fail over jobs of dead workers "
                  "(every checkout does this too; run it from cron when no worker is running)."),
    "run": Entry("run", "run", "Run a worker: check out jobs of the imported workflows until "
                 "Ctrl-C/SIGTERM (running jobs finish first; a second signal stops at once and "
                 "hands them back)."),
    "schedules": Entry("queue", "schedules", "The periodic workflows the workers registered: "
                       "schedule, last run and next run."),
    "web": Entry("web", "web", "Serve the dashboard: queues, jobs, job trees, and the operator's actions."),
}


class LazyGroup(click.Group):
    """The top-level group: its commands are imported by name, when one runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        command = getattr(importlib.import_module(f"{__name__}.{entry.module}"), entry.attr)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own layout, from the summaries: listing the commands imports none of them
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, click.Command(name, help=COMMANDS[name].summary).get_short_help_str(limit))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.option(
    "--database-url", metavar="URL",
    help="postgresql://, postgresql+psycopg:// or postgresql+psycopg2:// URL, as the app "
    "takes it (an async app's postgresql+asyncpg:// one too: psycopg 3 connects). "
    "Default: $POSTJOB_DATABASE_URL, "
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
