"""``postjob run`` (a worker, or several under a supervisor) and ``postjob reap``."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import click

from postjob_sa.errors import InvalidArgument
from postjob_sa.queue import JobQueue
from postjob_sa.registry import default_registry
from postjob_sa.worker import pooler
from postjob_sa.worker.options import DEFAULT_LEASE, WorkerOptions
from postjob_sa.worker.wakeup import relay_from_environment, wakeup_url_of

from . import _parse
from ._env import App, parse_url
from ._logging import configure_logging
from ._scaleout import metrics_served, relay_for
from ._supervisor import Supervisor
from .job import import_modules

log = logging.getLogger("postjob_sa.cli")


def load_app_context(spec: str) -> Callable[[], AbstractContextManager[Any]]:
    """``module:name``: a Flask app, or a factory that makes one; its ``app_context``."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise InvalidArgument(f"--app {spec!r}: give MODULE:APP, e.g. myapp:create_app")
    import_modules((module_name,))
    found = getattr(sys.modules[module_name], name, None)
    if found is None:
        raise InvalidArgument(f"--app {spec!r}: {module_name} has no {name}")
    app = found if hasattr(found, "app_context") else found() if callable(found) else found
    context = getattr(app, "app_context", None)
    if not callable(context):
        raise InvalidArgument(f"--app {spec!r} is not a Flask app nor a factory of one "
                              "(it has no app_context())")
    return cast("Callable[[], AbstractContextManager[Any]]", context)


def _child_argv(app: App, verbose: int, count: int | None, queues: tuple[str, ...],
                modules: tuple[str, ...], lease: float, batch: int, fast: bool,
                jobs_per_process: int, pooled: bool, log_format: str,
                app_spec: str | None) -> list[str]:
    argv = [sys.executable, "-m", "postjob_sa.cli"]
    argv += ["-" + "v" * verbose] if verbose else []
    argv += ["run", "--lease", repr(lease), "--batch", str(batch), "--log-format", log_format]
    argv += ["--pooled"] if pooled else ["--no-pooled"]
    argv += ["--jobs-per-process", str(jobs_per_process)]
    argv += ["--count", str(count)] if count is not None else []
    for q in queues:
        argv += ["--queue", q]
    for m in modules:
        argv += ["--import", m]
    argv += ["--app", app_spec] if app_spec is not None else []
    argv += ["--fast"] if fast else []
    return argv


@click.command()
@click.option("--count", type=int, help="Stop after N jobs (per process with --processes).")
@click.option("--queue", "queues", multiple=True, metavar="Q", help="Only jobs of this queue (repeatable).")
@click.option("--import", "modules", multiple=True, metavar="MODULE",
              help="Import a module that defines workflows (repeatable; required).")
@click.option("--app", "app_spec", metavar="MODULE:APP",
              help="A Flask app, or a factory that makes one (myapp:create_app): each job runs "
              "inside its app context (db.session, current_app); the workflows its modules "
              "import count as imported.")
@click.option("--lease", default=str(int(DEFAULT_LEASE)), show_default=True, metavar="DURATION",
              help="How long a job is held before a dead worker's job is rescued (the heartbeat renews it).")
@click.option("--batch", type=int, default=1, show_default=True,
              help="Jobs checked out per round trip (with --jobs-per-process 1).")
@click.option("--processes", "processes", type=int, default=None, metavar="N",
              help="Worker processes under one supervisor (restarted when they crash). [default: 1]")
@click.option("--concurrency", "old_processes", type=int, default=None, hidden=True,
              help="The old name of --processes.")
@click.option("--jobs-per-process", type=int, default=1, show_default=True, metavar="N",
              help="Jobs each process runs at once: sync workflows in threads, async ones as "
              "tasks on one event loop.")
@click.option("--pooled/--no-pooled", default=None,
              help="The database URL is (or is not) a pooler in transaction mode (PgBouncer): "
              "keep no session state on its connections. [default: found out at start]")
@click.option("--wakeup-url", metavar="URL",
              help="A direct URL to LISTEN on for new jobs (default: the database URL, unless "
              "--pooled).")
@click.option("--poll-interval", default="1s", show_default=True, metavar="DURATION",
              help="With --pooled and no --wakeup-url: how often the queue is looked at.")
@click.option("--metrics-port", type=int, metavar="N",
              help="Serve Prometheus metrics on http://0.0.0.0:N/metrics.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: one object per line, with the job's fields.")
@click.option("--fast", is_flag=True, help="Fast retries (0.01 s back-off base: tests and demos).")
@click.option("-v", "--verbose", count=True, help="-v: one log line per job; -vv: debug.")
@click.pass_obj
def run(app: App, count: int | None, queues: tuple[str, ...], modules: tuple[str, ...],
        app_spec: str | None, lease: str, batch: int, processes: int | None, old_processes: int | None,
        jobs_per_process: int, pooled: bool | None, wakeup_url: str | None, poll_interval: str,
        metrics_port: int | None, log_format: str, fast: bool, verbose: int) -> None:
    """Run a worker: check out jobs of the imported workflows until Ctrl-C/SIGTERM
    (running jobs finish first; a second signal stops at once and hands them back)."""
    verbose = max(verbose, app.verbose)
    configure_logging(verbose, log_format)
    if old_processes is not None:
        if processes is not None:
            raise InvalidArgument("give --processes (the new name of --concurrency), not both")
        log.warning("--concurrency is now called --processes (worker processes); "
                    "--jobs-per-process sets the jobs each process runs at once")
        processes = old_processes
    concurrency = 1 if processes is None else processes
    _parse.positive_int(count, "--count", 1 << 62)
    _parse.positive_int(concurrency, "--processes", 256)
    _parse.positive_int(jobs_per_process, "--jobs-per-process", 1000)
    lease_seconds = _parse.duration(lease, "--lease duration")
    poll_seconds = _parse.duration(poll_interval, "--poll-interval")
    _parse.positive_int(metrics_port, "--metrics-port", 65535)
    if wakeup_url is not None:
        parse_url(wakeup_url)  # a bad URL is refused before anything starts
    import_modules(modules)
    job_context = load_app_context(app_spec) if app_spec is not None else None
    if not default_registry.workflows:
        raise InvalidArgument(
            "no workflows to run: pass --import MODULE (a module defining @postjob_sa.workflow functions)"
        )
    waker = relay_from_environment()  # a child of a supervisor: it wakes this worker
    with app.session() as session, \
            metrics_served(metrics_port, app.engine, concurrency) as metrics_env:
        options = WorkerOptions(fast_mode=fast, lease=lease_seconds, batch=batch,
                                concurrency=jobs_per_process, pooled=pooled,
                                wakeup_url=None if wakeup_url is None
                                else wakeup_url_of(wakeup_url),
                                poll_interval=poll_seconds, count=count,
                                queues=list(queues) or None, waker=waker)
        queue = JobQueue(session, options=options, job_context=job_context)
        if concurrency > 1:
            if pooled is None:  # found out once, here: the workers are told
                pooled = pooler.pooled(app.engine, options.wakeup_url, poll_seconds)
            log.info("supervisor pid %d: starting %d workers (%s)", os.getpid(), concurrency,
                     app.display_url())
            argv = _child_argv(app, verbose, count, queues, modules, lease_seconds, batch, fast,
                               jobs_per_process, pooled, log_format, app_spec)
            env = {**os.environ, **metrics_env, "POSTJOB_DATABASE_URL": app.url_with_password()}
            code = Supervisor(argv, env, concurrency,
                              relay=relay_for(app, pooled, wakeup_url, poll_seconds)).run()
            if code:
                raise click.exceptions.Exit(code)
            return
        names = ", ".join(sorted(default_registry.workflows))
        log.info("worker pid %d started: queues %s, workflows %s, %d job(s) at once (%s)",
                 os.getpid(), ",".join(queues) or "all", names, jobs_per_process,
                 app.display_url())
        done = queue._worker().run()
        log.info("worker pid %d stopped after %d job(s)", os.getpid(), done)


@click.command()
@click.pass_obj
def reap(app: App) -> None:
    """Time out overdue jobs and fail over jobs of dead workers (every checkout does this too;
    run it from cron when no worker is running)."""
    with app.session() as session:
        n = JobQueue(session).reap()
        session.commit()
    click.echo(f"reaped {n} job(s)")
