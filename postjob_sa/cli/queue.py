"""``postjob queue`` (per-queue limits) and ``postjob schedules`` (periodic workflows)."""

from __future__ import annotations

from typing import Any

import click
from rich import box
from rich.table import Table

from postjob_sa import _limits, _session_sql
from postjob_sa.errors import InvalidArgument
from postjob_sa.queue import JobQueue

from . import _parse, _render
from ._env import App
from ._statements import DB_NOW


@click.group()
def queue() -> None:
    """Per-queue limits, obeyed by every worker."""


@queue.command("limit")
@click.argument("name")
@click.option("--concurrency", type=int, metavar="N", help="At most N jobs processing at once.")
@click.option("--rate", type=int, metavar="M", help="At most M starts per --per.")
@click.option("--per", default="1s", show_default=True, metavar="DURATION",
              help="The period of --rate (e.g. 1s, 1m, 1h).")
@click.option("--clear", is_flag=True, help="Remove the queue's limits.")
@click.pass_obj
def queue_limit(app: App, name: str, concurrency: int | None, rate: int | None, per: str,
                clear: bool) -> None:
    """Set the limits of queue NAME: --concurrency N and/or --rate M [--per DURATION]."""
    if clear and (concurrency is not None or rate is not None):
        raise InvalidArgument("give --clear alone, or the limits to set")
    if not clear and concurrency is None and rate is None:
        raise InvalidArgument("give --concurrency N and/or --rate M (or --clear)")
    period = _parse.duration(per, "--per duration")
    with app.session() as session:
        JobQueue(session).set_queue_limits(name, concurrency=concurrency, rate=rate, period=period)
        session.commit()
    if clear:
        click.echo(f"queue {name}: no limits")
        return
    parts = [f"at most {concurrency} processing"] if concurrency is not None else []
    parts += [f"at most {rate} starts per {_render.duration(period)}"] if rate is not None else []
    click.echo(f"queue {name}: {', '.join(parts)}")


@queue.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def queue_list(app: App, as_json: bool) -> None:
    """The limited queues: their limits, jobs processing now and starts in the last period."""
    with app.session() as session:
        rows = _limits.report(session)
    if as_json:
        _render.print_json(rows)
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("queue", "concurrency", "processing", "rate", "per", "started"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(r["queue"], _text(r["concurrency"]), str(r["processing"]), _text(r["rate"]),
                      _render.duration(r["period"]), str(r["started"]) if r["rate"] is not None else "")
    _render.console().print(table if rows else "no queue has limits")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def schedules(app: App, as_json: bool) -> None:
    """The periodic workflows the workers registered: schedule, last run and next run."""
    with app.session() as session:
        rows = [dict(r) for r in session.execute(_session_sql.SCHEDULES_LIST).mappings()]
        now = session.execute(DB_NOW).scalar_one()
    if as_json:
        _render.print_json(rows)
        return
    console = _render.console()
    if not rows:
        console.print("no schedules (no worker has registered one)")
        return
    console.print(_render.schedules_table(rows, now, console.width))


def _text(value: Any) -> str:
    return "" if value is None else str(value)
