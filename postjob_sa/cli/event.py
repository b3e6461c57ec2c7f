"""``postjob event``: emit an event (its waiting jobs wake when it commits), prune old ones."""

from __future__ import annotations

import click

from postjob_sa import _session_sql
from postjob_sa.queue import JobQueue

from . import _parse
from ._env import App


@click.group()
def event() -> None:
    """Events that durable workflows wait for (postjob_sa.wait_for_event)."""


@event.command("emit")
@click.argument("key")
@click.argument("payload", required=False)
@click.pass_obj
def event_emit(app: App, key: str, payload: str | None) -> None:
    """Emit an event under KEY with PAYLOAD (JSON; quote strings: '"text"'; default null):
    the jobs waiting for KEY wake, and later waits get it too. Prints the event's id."""
    value = _parse.json_value(payload, "PAYLOAD") if payload is not None else None
    with app.session() as session:
        event_id = JobQueue(session).emit_event(key, value)
        session.commit()
    click.echo(event_id)


@event.command("prune")
@click.option("--older-than", required=True, metavar="DURATION",
              help="Delete the events emitted longer ago than this (30d, 12h, 90m, 45s).")
@click.pass_obj
def event_prune(app: App, older_than: str) -> None:
    """Delete old events. A wait that already got one keeps what it got; a wait that starts
    later no longer finds it."""
    seconds = _parse.duration(older_than, "--older-than duration")
    with app.session() as session:
        deleted = session.execute(_session_sql.EVENTS_PRUNE, {"seconds": seconds}).scalar_one()
        session.commit()
    click.echo(f"deleted {deleted} event(s) older than {older_than}")
