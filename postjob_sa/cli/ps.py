"""``postjob ps``: list, watch, show and draw jobs."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from postjob_sa import _hot_tables
from postjob_sa.durable import view as durable_view
from postjob_sa.worker.unknown import Served, served

from . import _parse, _query, _render
from ._env import App

LIST_COMMAND = "list"


class PsGroup(click.Group):
    """``ps [ID…] [options]`` lists jobs; ``ps top|show|full …`` are subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = [LIST_COMMAND, *args]
        return super().parse_args(ctx, args)


def _filters(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--tags", metavar="K:V,…", help="Only jobs with these tags.")(f)
    f = click.option("--status", "statuses", metavar="S,…", help="Only jobs in these statuses.")(f)
    f = click.option("--limit", type=int, default=100, show_default=True, help="At most N jobs.")(f)
    return f


def _listing(app: App, ids: tuple[str, ...], tags: str | None, statuses: str | None,
             limit: int) -> tuple[_query.Listing, bool, Served, list[str]]:
    job_ids = _parse.job_ids(ids)
    tags_json = _parse.tags_json(tags)
    chosen = _parse.statuses(statuses)
    _parse.positive_int(limit, "--limit", 100_000)
    with app.connect_checked() as conn:
        listing = _query.list_jobs(conn, ids=job_ids or None, tags_json=tags_json,
                                   statuses=chosen, limit=limit)
        workers = served(conn)
        tables = _hot_tables.warnings(_hot_tables.read(conn))  # autovacuum off, swollen tables
    return listing, bool(job_ids), workers, tables


def _warnings(tables: list[str]) -> list[RenderableType]:
    return [Text(f"warning: {line}", style="yellow") for line in tables]


def _warn(lines: list[str | None]) -> None:
    """Warnings about what a table shows: on stderr, each a line of its own, after the table
    (what scripts read of stdout stays the table)."""
    shown = [line for line in lines if line]
    if shown:
        sys.stdout.flush()
        err = _render.console(stderr=True)
        for line in shown:
            err.print(Text(line, style="yellow"), soft_wrap=True)


def _view(listing: _query.Listing, full_id: bool, limit: int, width: int,
          workers: Served, notes: bool = True) -> RenderableType:
    """The table; with ``notes`` (ps top's screen) the note about jobs no worker runs too."""
    parts: list[RenderableType] = []
    if listing.rows:
        parts.append(_render.ps_table(listing.rows, full_id=full_id, width=width, served=workers))
        note = _render.no_worker_note(listing.rows, workers)
        if note and notes:
            parts.append(Text(note, style="yellow"))
    else:
        parts.append(Text("no jobs", style="dim"))
    if listing.more:
        parts.append(Text(f"(more than {limit} jobs match: showing the first {limit}; use --limit)",
                          style="yellow"))
    return Group(*parts)


@click.group(cls=PsGroup, context_settings={"ignore_unknown_options": False})
def ps() -> None:
    """List root jobs newest first (with IDs: those jobs' trees). Subcommands: top, show, full."""


@ps.command(LIST_COMMAND, hidden=True)
@click.argument("ids", nargs=-1)
@_filters
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def ps_list(app: App, ids: tuple[str, ...], tags: str | None, statuses: str | None,
            limit: int, as_json: bool) -> None:
    """List jobs."""
    listing, with_ids, workers, tables = _listing(app, ids, tags, statuses, limit)
    if as_json:
        _render.print_json({"jobs": [_render.ps_json(r, workers) for r in listing.rows],
                            "more": listing.more, "warnings": tables})
        return
    console = _render.console()
    console.print(_view(listing, with_ids, limit, console.width, workers, notes=False))
    _warn([_render.no_worker_note(listing.rows, workers) if listing.rows else None,
           *(f"warning: {line}" for line in tables)])


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """A reader of single key presses with a timeout; without a terminal on stdin it only
    sleeps (so `ps top` never blocks on, or spins at the end of, a pipe)."""
    if not sys.stdin.isatty():
        def wait(timeout: float) -> str | None:
            time.sleep(timeout)
            return None
        yield wait
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read(timeout: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode(errors="replace") if ready else None

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class _Stop:
    """Ctrl-C or SIGTERM for ``ps top``: at once while it waits between refreshes; during a
    refresh, when that refresh has ended (an interruption inside the driver or the connection
    pool could leave the pool's lock held or the connection mid-statement, and the exit would
    then hang). A second signal during a refresh interrupts it."""

    def __init__(self) -> None:
        self.asked = False
        self.waiting = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        again, self.asked = self.asked, True
        if self.waiting or again:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def wait(self, key: Callable[[float], str | None], timeout: float) -> str | None:
        """A key press (or None) within ``timeout``, interruptible."""
        if self.asked:
            raise KeyboardInterrupt
        self.waiting = True
        try:
            return key(timeout)
        finally:
            self.waiting = False


@ps.command("top")
@click.argument("ids", nargs=-1)
@_filters
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--iterations", type=int, help="Stop after N refreshes (default: until q or Ctrl-C).")
@click.pass_obj
def ps_top(app: App, ids: tuple[str, ...], tags: str | None, statuses: str | None, limit: int,
           interval: float, iterations: int | None) -> None:
    """Watch jobs, refreshed every second; q or Ctrl-C quits."""
    _parse.positive_int(iterations, "--iterations")
    if not 0.1 <= interval <= 3600:
        raise click.BadParameter("must be between 0.1 and 3600 seconds", param_hint="--interval")

    console = _render.console()

    def frame() -> RenderableType:
        listing, with_ids, workers, tables = _listing(app, ids, tags, statuses, limit)
        stamp = time.strftime("%H:%M:%S")
        header = Text(f"postjob top  {stamp}  {app.display_url()}  (q quits)", style="bold")
        return Group(header, _view(listing, with_ids, limit, console.width, workers),
                     *_warnings(tables))

    stop = _Stop()
    shown = 0
    try:
        with stop.installed(), _keys() as key, Live(frame(), console=console, auto_refresh=False,
                                                    screen=console.is_terminal) as live:
            shown = 1
            while iterations is None or shown < iterations:
                deadline = time.monotonic() + interval
                while (left := deadline - time.monotonic()) > 0:
                    if (stop.wait(key, left) or "").lower() == "q":
                        return
                live.update(frame(), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass


@ps.command("show")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def ps_show(app: App, ids: tuple[str, ...], as_json: bool) -> None:
    """Every field of the jobs IDS."""
    job_ids = _parse.job_ids(ids)
    with app.connect_checked():
        pass
    fields = [_render.job_fields(j, t) for j, t in _query.show_jobs(app.engine, job_ids)]
    with app.engine.connect() as conn:  # what its durable calls stored (steps, sleeps, waits)
        durable = durable_view.of_jobs(conn, job_ids)
    for f in fields:
        f.update(durable[f["id"]].fields())
    if as_json:
        _render.print_json(fields)
        return
    console = _render.console()
    for f in fields:
        console.print(_render.show_table(f))
        console.print()


@ps.command("full")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def ps_full(app: App, ids: tuple[str, ...], as_json: bool) -> None:
    """The job trees under IDS, children indented, with status and result per job."""
    job_ids = _parse.job_ids(ids)
    with app.connect_checked() as conn:
        found = _query.subtrees(conn, job_ids)
        workers = served(conn)
    if as_json:
        _render.print_json([[_render.ps_json(r, workers) for r in tree] for tree in found])
        return
    console = _render.console()
    console.print(_render.trees(found, workers, console.width))
    _warn([_render.no_worker_note([r for tree in found for r in tree], workers)])
