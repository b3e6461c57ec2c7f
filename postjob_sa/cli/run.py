"""``postjob run`` (a worker, or several under a supervisor) and ``postjob reap``."""

from __future__ import annotations

import logging
import os
import sys

import click

from postjob_sa.errors import InvalidArgument
from postjob_sa.queue import DEFAULT_LEASE, JobQueue
from postjob_sa.registry import default_registry

from . import _parse
from ._env import App
from ._logging import configure_logging
from ._supervisor import Supervisor
from .job import import_modules

log = logging.getLogger("postjob_sa.cli")


def _child_argv(app: App, verbose: int, count: int | None, queues: tuple[str, ...],
                modules: tuple[str, ...], lease: float, batch: int, fast: bool) -> list[str]:
    argv = [sys.executable, "-m", "postjob_sa.cli"]
    argv += ["-" + "v" * verbose] if verbose else []
    argv += ["run", "--lease", repr(lease), "--batch", str(batch)]
    argv += ["--count", str(count)] if count is not None else []
    for q in queues:
        argv += ["--queue", q]
    for m in modules:
        argv += ["--import", m]
    argv += ["--fast"] if fast else []
    return argv


@click.command()
@click.option("--count", type=int, help="Stop after N jobs (per process with --concurrency).")
@click.option("--queue", "queues", multiple=True, metavar="Q", help="Only jobs of this queue (repeatable).")
@click.option("--import", "modules", multiple=True, metavar="MODULE",
              help="Import a module that defines workflows (repeatable; required).")
@click.option("--lease", default=str(int(DEFAULT_LEASE)), show_default=True, metavar="DURATION",
              help="How long a job is held before a dead worker's job is rescued (the heartbeat renews it).")
@click.option("--batch", type=int, default=1, show_default=True, help="Jobs checked out per round trip.")
@click.option("--concurrency", type=int, default=1, show_default=True,
              help="Worker processes (restarted when they crash).")
@click.option("--fast", is_flag=True, help="Fast retries (0.01 s back-off base: tests and demos).")
@click.option("-v", "--verbose", count=True, help="-v: one log line per job; -vv: debug.")
@click.pass_obj
def run(app: App, count: int | None, queues: tuple[str, ...], modules: tuple[str, ...],
        lease: str, batch: int, concurrency: int, fast: bool, verbose: int) -> None:
    """Run a worker: check out jobs of the imported workflows until Ctrl-C/SIGTERM
    (the current job finishes first; a second signal stops at once)."""
    verbose = max(verbose, app.verbose)
    configure_logging(verbose)
    _parse.positive_int(count, "--count", 1 << 62)
    _parse.positive_int(concurrency, "--concurrency", 256)
    lease_seconds = _parse.duration(lease, "--lease duration")
    import_modules(modules)
    if not default_registry.workflows:
        raise InvalidArgument(
            "no workflows to run: pass --import MODULE (a module defining @postjob_sa.workflow functions)"
        )
    with app.session() as session:
        queue = JobQueue(session, fast_mode=fast, lease=lease_seconds, batch_size=batch)
        if concurrency > 1:
            log.info("supervisor pid %d: starting %d workers (%s)", os.getpid(), concurrency,
                     app.display_url())
            argv = _child_argv(app, verbose, count, queues, modules, lease_seconds, batch, fast)
            env = {**os.environ, "POSTJOB_DATABASE_URL": app.url_with_password()}
            code = Supervisor(argv, env, concurrency).run()
            if code:
                raise click.exceptions.Exit(code)
            return
        names = ", ".join(sorted(default_registry.workflows))
        log.info("worker pid %d started: queues %s, workflows %s (%s)", os.getpid(),
                 ",".join(queues) or "all", names, app.display_url())
        done = queue.work(count=count, queues=list(queues) or None)
        log.info("worker pid %d stopped after %d job(s)", os.getpid(), done)


@click.command()
@click.option("--fast", is_flag=True, help="Fast-mode back-off for the retries it schedules.")
@click.pass_obj
def reap(app: App, fast: bool) -> None:
    """Time out overdue jobs and fail over jobs of dead workers (every checkout does this too;
    run it from cron when no worker is running)."""
    with app.session() as session:
        n = JobQueue(session, fast_mode=fast).reap()
        session.commit()
    click.echo(f"reaped {n} job(s)")
