"""``postjob history``: the ranges of job ids the record is partitioned by, and how long
finished jobs are kept (``JobQueue.set_history`` / ``rotate_history``)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

import click
from rich import box
from rich.table import Table

from postjob_sa._history import MAX_KEEP, MAX_PARTITION_SIZE, MIN_PARTITION_SIZE
from postjob_sa.errors import InvalidArgument
from postjob_sa.queue import JobQueue

from . import _parse, _render
from ._env import App

#: A keep of at most a century (a duration beyond means "for ever": say so with --keep forever).
MAX_KEEP_SECONDS = MAX_KEEP.total_seconds()


@click.group()
def history() -> None:
    """History: ranges of job ids, retention (see docs/operations.md)."""


@history.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def history_status(app: App, as_json: bool) -> None:
    """The settings, and each range: ids, jobs, bytes, newest settle, what pins it."""
    with app.session() as session:
        queue = JobQueue(session)
        settings, ranges = queue.history_settings(), queue.history_status()
    keep = None if settings.keep is None else settings.keep.total_seconds()
    if as_json:
        _render.print_json({"keep_seconds": keep, "partition_size": settings.partition_size,
                            "ranges": [asdict(r) for r in ranges]})
        return
    click.echo(f"keep: {'for ever' if keep is None else _render.duration(keep)}; "
               f"ranges of {settings.partition_size:,} ids")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("range", "ids", "jobs", "size", "newest settle", "pinned by"):
        table.add_column(col, no_wrap=True)
    for r in ranges:
        ids = ("the rest" if r.to_id is None else
               f"{'…' if r.from_id is None else f'{r.from_id:,}'} to {r.to_id - 1:,}")
        table.add_row(r.name, ids, f"{r.jobs:,}", f"{r.bytes / 1e6:,.1f} MB",
                      "" if r.newest_settle is None else r.newest_settle.isoformat(" ", "seconds"),
                      "" if r.pinned_by is None else f"job tree {r.pinned_by}")
    _render.console().print(table)


@history.command("set")
@click.option("--keep", metavar="DURATION", help="Keep a finished job this long after it "
              "settled (e.g. 30d, 12h); 'forever' keeps every job. Default: as it is.")
@click.option("--partition-size", type=int, metavar="N", help=f"Job ids per range (at least "
              f"{MIN_PARTITION_SIZE:,}, at most {MAX_PARTITION_SIZE:,}; the next rotation "
              "ends the open range N ids on). Default: as it is.")
@click.pass_obj
def history_set(app: App, keep: str | None, partition_size: int | None) -> None:
    """Set how long finished jobs are kept (--keep) and the ids per range (--partition-size)."""
    if keep is None and partition_size is None:
        raise InvalidArgument("give --keep DURATION and/or --partition-size N")
    with app.session() as session:
        queue = JobQueue(session)
        now = queue.history_settings()
        kept = now.keep
        if keep is not None:
            kept = None if keep.strip().lower() in ("forever", "for ever", "none") else timedelta(
                seconds=_parse.duration(keep, "--keep duration", maximum=MAX_KEEP_SECONDS))
        size = now.partition_size if partition_size is None else partition_size
        queue.set_history(keep=kept, partition_size=size)
        session.commit()
    click.echo(f"history: keep {'for ever' if kept is None else _render.duration(kept.total_seconds())}, "
               f"ranges of {size:,} ids (the workers rotate every few minutes; "
               "`postjob history rotate` does it now)")


@history.command("rotate")
@click.pass_obj
def history_rotate(app: App) -> None:
    """Narrow the open range to the size set, create the ranges ahead, drop those past --keep
    that no unfinished tree pins, compact a closed one."""
    with app.session() as session:
        report = JobQueue(session).rotate_history()
        session.commit()
    for line in report.lines():
        click.echo(line)
