"""``postjob job``: enqueue, reset, cancel, force, resolve and prune jobs."""

from __future__ import annotations

import importlib
import json
import sys
from difflib import get_close_matches
from typing import Any

import click

from postjob_sa.errors import InvalidArgument
from postjob_sa.models import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from postjob_sa.queue import JobQueue
from postjob_sa.registry import Workflow, default_registry
from postjob_sa.worker.unknown import MAX_NAMES, Served, served

from . import _parse, _query
from ._env import App

DEFAULT_PRUNE_BATCH = 1000


def import_modules(modules: tuple[str, ...]) -> None:
    """Import workflow modules (from the current directory too); InvalidArgument if one fails."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise InvalidArgument(f"cannot import workflow module {name!r}: {exc}") from None


def _refuse_unknown_options(args: tuple[str, ...]) -> None:
    """ARGs may start with '-' (JSON numbers: -1), so click lets unknown options through as
    ARGs: an ARG that looks like an option and is no JSON is named as the unknown option."""
    ctx = click.get_current_context()
    for arg in args:
        if not arg.startswith("-") or arg == "-":
            continue
        try:
            json.loads(arg)
        except ValueError:
            known = [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
            name = arg.partition("=")[0]
            raise click.NoSuchOption(name, possibilities=get_close_matches(name, known), ctx=ctx) from None


@click.group()
def job() -> None:
    """Change jobs."""


@job.command("enqueue", context_settings={"ignore_unknown_options": True})
@click.argument("workflow")
@click.argument("args", nargs=-1)
@click.option("--queue", help="Queue name (default: the workflow's, else q).")
@click.option("--tags", metavar="K:V,…", help="Tags, e.g. customer:42,kind:report.")
@click.option("--max-attempts", type=int, help="Runs before the job fails (default: the workflow's "
              "with --import, else 5).")
@click.option("--timeout", metavar="DURATION", help="Deadline, e.g. 90s, 10m, 2h.")
@click.option("--run-at", metavar="ISO-8601", help="Not before this time (local unless an offset is given).")
@click.option("--workflow-version", "version", help="The workflow version the job needs.")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Higher runs first (among due jobs).")
@click.option("--unique-key", metavar="KEY",
              help="While an unfinished job holds KEY, print its id instead of adding one.")
@click.option("--import", "modules", multiple=True, metavar="MODULE",
              help="Import a workflow module first: the workflow must exist, and its own defaults "
              "(queue, max attempts, timeout) apply. Without it they are not known here.")
@click.pass_obj
def job_enqueue(
    app: App, workflow: str, args: tuple[str, ...], queue: str | None, tags: str | None,
    max_attempts: int | None, timeout: str | None, run_at: str | None, version: str | None,
    priority: int, unique_key: str | None, modules: tuple[str, ...],
) -> None:
    """Enqueue a root job of WORKFLOW; each ARG is JSON (quote strings: '"text"').
    Prints the new job's id.

    Without --import, the options of the workflow's @postjob_sa.workflow(...) are not
    known: the job gets the options given here, else the table's defaults, queue q, 5
    attempts and no timeout (a warning on stderr says which)."""
    _refuse_unknown_options(args)
    values = [_parse.json_value(a, f"argument {i}") for i, a in enumerate(args, 1)]
    parsed_tags = _parse.tags(tags)
    seconds = _parse.duration(timeout, "timeout") if timeout is not None else None
    when = _parse.timestamp(run_at) if run_at is not None else None
    if modules:
        import_modules(modules)
    # imported here (--import, or by a host that calls the CLI in its own process)
    found: Workflow[Any, Any] | None = default_registry.get(workflow)
    if modules and found is None:
        raise InvalidArgument(f"no workflow named {workflow!r} in {', '.join(modules)}")
    with app.session() as session:
        new = JobQueue(session).enqueue(
            found or workflow, *values, queue=queue, tags=parsed_tags, max_attempts=max_attempts,
            timeout=seconds, version=version, run_at=when, priority=priority,
            unique_key=unique_key,
        )
        session.commit()
        click.echo(new.id)
        live = served(session.connection()) if found is None else None
    if found is None:
        _warn_defaults(workflow, queue, max_attempts, seconds)
    if live is not None and workflow not in live.workflows:
        _note_unknown(workflow, live)


def _note_unknown(workflow: str, live: Served) -> None:
    """Say that no running worker knows the workflow: a typo would wait for ever."""
    names = sorted(live.workflows)
    known = (f"running workers know {', '.join(names[:MAX_NAMES]) or 'none'}"
             + (f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")
             if live.workers else "no worker is running")
    click.echo(f"postjob: note: no running worker knows a workflow named {workflow!r} "
               f"({known}): check the name; the job waits until a worker that imports it "
               "starts (postjob run --import MODULE)", err=True)


def _warn_defaults(workflow: str, queue: str | None, max_attempts: int | None,
                   timeout: float | None) -> None:
    """Say, in one line, which of the job's settings are the table's defaults: the workflow's
    own options are not known where its module is not imported."""
    assumed = [f"queue {DEFAULT_QUEUE!r}" if queue is None else "",
               f"max_attempts {DEFAULT_MAX_ATTEMPTS}" if max_attempts is None else "",
               "no timeout" if timeout is None else ""]
    if any(assumed):
        click.echo(f"postjob: warning: {workflow} is not imported here, so the job has the "
                   f"table's defaults, not its @postjob_sa.workflow options: "
                   f"{', '.join(a for a in assumed if a)} (--import MODULE uses the workflow's "
                   "own)", err=True)


@job.command("reset")
@click.argument("ids", nargs=-1, required=True)
@click.pass_obj
def job_reset(app: App, ids: tuple[str, ...]) -> None:
    """Make jobs (and their failed or timed-out descendants) ready again, errors cleared."""
    job_ids = _parse.job_ids(ids)
    with app.session() as session:
        done = JobQueue(session).reset(*job_ids)
        session.commit()
    click.echo(f"reset {len(done)} job(s): {', '.join(map(str, done))}")


@job.command("cancel")
@click.argument("id")
@click.pass_obj
def job_cancel(app: App, id: str) -> None:
    """Cancel an unfinished job and its unfinished descendants (status cancelled; a running
    job is told at its next spawn, result, status note or heartbeat)."""
    job_id = _parse.job_id(id)
    with app.session() as session:
        done = JobQueue(session).cancel(job_id)
        session.commit()
    click.echo(f"cancelled {len(done)} job(s): {', '.join(map(str, done))}")


@job.command("force")
@click.argument("id")
@click.pass_obj
def job_force(app: App, id: str) -> None:
    """Run a ready, err or sleeping job as soon as possible."""
    job_id = _parse.job_id(id)
    with app.session() as session:
        JobQueue(session).force(job_id)
        session.commit()
    click.echo(f"job {job_id} will run as soon as a worker is free")


@job.command("resolve")
@click.argument("token")
@click.argument("result", required=False)
@click.option("--error", metavar="MESSAGE", help="Fail the manual job with this message instead.")
@click.pass_obj
def job_resolve(app: App, token: str, result: str | None, error: str | None) -> None:
    """Finish the manual job of TOKEN with RESULT (JSON), or fail it with --error."""
    if error is not None and result is not None:
        raise InvalidArgument("give either RESULT or --error, not both")
    if error is None and result is None:
        raise InvalidArgument("give the RESULT (JSON) or --error MESSAGE")
    value = _parse.json_value(result, "RESULT") if result is not None else None
    with app.session() as session:
        job_id = JobQueue(session).resolve(token, value, error=error)
        session.commit()
    click.echo(f"job {job_id} {'failed' if error is not None else 'resolved'}")


@job.command("prune")
@click.option("--older-than", required=True, metavar="DURATION",
              help="Only trees whose root finished longer ago than this (30d, 12h, 90m, 45s).")
@click.option("--status", "statuses", metavar="S,…", help="Root statuses to prune (default ok,failed,timeout,cancelled).")
@click.option("--batch", type=int, default=DEFAULT_PRUNE_BATCH, show_default=True,
              help="Trees deleted per transaction.")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.pass_obj
def job_prune(app: App, older_than: str, statuses: str | None, batch: int, dry_run: bool) -> None:
    """Delete finished root jobs whose whole tree is final, with their trees."""
    seconds = _parse.duration(older_than, "--older-than duration")
    chosen = _parse.final_statuses(statuses)
    _parse.positive_int(batch, "--batch", 100_000)
    with app.connect_checked():
        pass
    report = _query.prune(app.engine, older_than=seconds, statuses=chosen, batch=batch, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    cutoff = report.cutoff.isoformat(sep=" ", timespec="seconds") if report.cutoff else "?"
    click.echo(
        f"{verb} {report.roots} root job(s), {report.jobs} job(s) in all "
        f"({'/'.join(chosen)}, finished before {cutoff})"
    )
