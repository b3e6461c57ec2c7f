"""``postjob demo``: a self-contained tour on the embedded server (or any database): migrate,
enqueue a workflow tree, run workers, resolve its manual approval by token, show the tree."""

from __future__ import annotations

import time

import click
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from postjob_sa._migrations import installed_revision, migrate
from postjob_sa.models import Job, Status
from postjob_sa.queue import JobQueue

from . import _query, _render
from ._env import App


def _drain(engine: Engine) -> int:
    """Run every runnable job in this process (a worker loop that stops when idle)."""
    with Session(engine) as session:
        return JobQueue(session, fast_mode=True).drain()


def _status(engine: Engine, job_id: int) -> Status:
    with Session(engine) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.status


@click.command()
@click.pass_obj
def demo(app: App) -> None:
    """A tour: enqueue a fan-out/fan-in workflow with a manual approval, run it, show it.
    Without a database URL it uses the embedded server (data kept between runs)."""
    from postjob_sa import demo as workflows  # registers its workflows in this process only

    started = time.monotonic()
    out = _render.console()
    engine = app.engine
    out.print(f"[bold]postjob demo[/] on {app.display_url()} ({app.source})")

    migrate(engine)
    with engine.connect() as conn:
        out.print(f"1. schema at revision {installed_revision(conn)} (postjob db migrate)")

    words = list(workflows.WORDS)
    with Session(engine) as session:
        root_id = JobQueue(session).enqueue(workflows.report, words, tags={"demo": "tour"}).id
        session.commit()
    out.print(f"2. enqueued job {root_id}: demo.report {_render.compact_json(words)}")

    ran = _drain(engine)
    with Session(engine) as session:
        tokens = _query.manual_tokens(session, root_id)
    out.print(f"3. workers ran {ran} jobs; job {root_id} is {_status(engine, root_id).value}, "
              f"waiting for {len(tokens)} approval(s)")
    if not tokens:
        raise click.ClickException(f"job {root_id} did not reach its approval step")

    for manual_id, token in tokens:
        with Session(engine) as session:
            JobQueue(session).resolve(token, {"approved_by": "postjob demo"})
            session.commit()
        out.print(f"4. resolved manual job {manual_id}: postjob job resolve {token} "
                  "'{\"approved_by\": \"postjob demo\"}'")

    ran = _drain(engine)
    final = _status(engine, root_id)
    out.print(f"5. workers ran {ran} more job(s); job {root_id} is {final.value} "
              f"after {time.monotonic() - started:.1f}s")
    out.print(f"\n[bold]postjob ps full {root_id}[/]")
    with engine.connect() as conn:
        out.print(_render.trees(_query.subtrees(conn, [root_id])))
    if final is not Status.ok:
        raise click.exceptions.Exit(1)
