"""The pages: each reads what it shows (through ``queries``) and names its templates. A page is
a layout plus named fragments; the page script refreshes the fragments on their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import NotFound

from postjob_sa import _history, _hot_tables
from postjob_sa.durable import view as durable_view

from . import forms
from . import job_queries as jq
from . import queries as q
from .charts import throughput_chart
from .redaction import Redaction
from .render import STATUS_ORDER

Fragment = tuple[str, dict[str, Any]]  # (template, context)


@dataclass
class Screen:
    """What a view hands the app: the page template and its live fragments."""

    template: str
    title: str
    context: dict[str, Any] = field(default_factory=dict)
    fragments: dict[str, Fragment] = field(default_factory=dict)


@dataclass
class Settings:
    #: seconds between live refreshes (0: none)
    refresh: float = 2.0
    #: how long a due job waits before the overview calls it stranded
    stuck_after: float = 60.0
    page_size: int = 50
    #: what the pages show of args and results
    redaction: Redaction = field(default_factory=Redaction)


# -- overview --------------------------------------------------------------------------------

#: Seconds the last hour's throughput is reused for: it is counted by minute (from
#: postjob.settled_counts, a few rows a minute), so a refresh within the window shows the same.
THROUGHPUT_REUSED_FOR = 15.0


class Reused:
    """A value read at most once every ``seconds``, shared by one dashboard's requests."""

    def __init__(self, seconds: float = THROUGHPUT_REUSED_FOR):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._value: Any = None

    def get(self, read: Callable[[], Any]) -> Any:
        with self._lock:
            if time.monotonic() - self._read_at >= self.seconds:
                self._value, self._read_at = read(), time.monotonic()
            return self._value


@dataclass
class QueueLine:
    queue: str
    jobs: dict[str, int] = field(default_factory=dict)
    due: int = 0
    ok_last_hour: int = 0


def _queue_lines(counts: list[q.Row], flow: list[q.Row]) -> tuple[list[QueueLine], QueueLine]:
    lines: dict[str, QueueLine] = {}
    total = QueueLine("all queues")
    for r in counts:
        line = lines.setdefault(r.queue, QueueLine(r.queue))
        for target in (line, total):
            target.jobs[r.status] = target.jobs.get(r.status, 0) + int(r.jobs)
            target.due += int(r.due)
    for r in flow:
        if r.status == "ok":
            line = lines.setdefault(r.queue, QueueLine(r.queue))
            line.ok_last_hour += int(r.jobs)
            total.ok_last_hour += int(r.jobs)
    return sorted(lines.values(), key=lambda x: x.queue), total


@dataclass
class WorkerLine:
    identifier: str
    connections: list[q.Row] = field(default_factory=list)
    jobs: int = 0
    since: datetime | None = None
    lease_expires_at: datetime | None = None
    heartbeat_at: datetime | None = None
    #: its heartbeat is current (None: it has no worker row, e.g. a worker of pj0001's code)
    beating: bool | None = None

    @property
    def up(self) -> bool:
        return bool(self.beating or self.connections)


def _worker_lines(registered: list[q.Row], connected: list[q.Row], busy: list[q.Row]) -> list[WorkerLine]:
    lines: dict[str, WorkerLine] = {}
    for r in registered:
        line = lines.setdefault(r.identifier, WorkerLine(r.identifier))
        if line.heartbeat_at is None or r.heartbeat_at > line.heartbeat_at:
            line.heartbeat_at = r.heartbeat_at
        line.beating = bool(line.beating) or bool(r.alive)
    for r in connected:
        lines.setdefault(r.identifier, WorkerLine(r.identifier)).connections.append(r)
    for r in busy:
        line = lines.setdefault(r.identifier, WorkerLine(r.identifier))
        line.jobs, line.since, line.lease_expires_at = int(r.jobs), r.since, r.lease_expires_at
    return sorted(lines.values(), key=lambda w: w.identifier)


def overview(conn: Connection, settings: Settings, throughput: Reused) -> Screen:
    counts = q.queue_status_counts(conn)
    ok = q.ok_count(conn, sum(int(r.jobs) for r in counts))
    flow: list[q.Row] = throughput.get(lambda: q.throughput(conn))
    lines, total = _queue_lines(counts, flow)
    workers = _worker_lines(q.workers_registered(conn), q.workers_connected(conn), q.workers_busy(conn))
    manual_count, manual = q.manual_steps(conn)
    for m in manual:
        m.values["label"] = settings.redaction.label(m.values.pop("args"))
    up = sum(1 for w in workers if w.up)
    return Screen(
        "overview.html",
        "Overview",
        fragments={
            "queues": ("fragments/queues.html", {
                "lines": lines, "total": total, "ok": ok, "columns": [s for s in STATUS_ORDER if s != "ok"],
                "ended_badly_exact": q.ended_badly_exact(counts), "ended_badly_cap": q.ERRORED_COUNT_CAP,
            }),
            "throughput": ("fragments/throughput.html", {"chart": throughput_chart(flow)}),
            "waiting": ("fragments/waiting.html", {
                "oldest": q.oldest_due(conn, [x.queue for x in lines if x.due]),
                "due": {x.queue: x.due for x in lines}, "manual": manual, "manual_count": manual_count,
            }),
            "workers": ("fragments/workers.html", {"workers": workers, "up": up}),
            "stranded": ("fragments/stranded.html", {
                "groups": q.stranded(conn, settings.stuck_after), "up": up,
                "stuck_after": settings.stuck_after,
            }),
            "tables": ("fragments/tables.html", hot_tables_context(conn)),
        },
    )


def hot_tables_context(conn: Connection) -> dict[str, Any]:
    """The hot tables and the job record: sizes, dead rows, vacuums, and what is wrong."""
    relations = q.hot_tables(conn)
    return {"relations": relations, "warnings": _hot_tables.warnings(relations),
            "size": _hot_tables.size_text}


# -- jobs list -------------------------------------------------------------------------------


def jobs(conn: Connection, args: MultiDict[str, str], settings: Settings) -> Screen:
    """The list; InvalidArgument for a malformed filter (the app shows it on the page)."""
    query = forms.list_query(args)
    before = forms.cursor(args)
    shown = settings.redaction
    page = jq.jobs_page(conn, query.to_filter(q.db_now(conn)), before, settings.page_size, shown.whole)
    for r in page.rows:
        r.values["args_text"] = shown.text(r.args_text, 160)
    return Screen(
        "jobs.html",
        "Jobs",
        context={"query": query, "statuses": forms.STATUSES, "ages": list(forms.AGES)},
        fragments={
            "rows": ("fragments/job_rows.html", {
                "page": page, "query": query, "first_page": before is None,
            }),
        },
    )


# -- one job ---------------------------------------------------------------------------------


#: Deeper jobs are drawn at this indentation (their full_id still says where they are).
MAX_INDENT = 12


@dataclass
class Node:
    """A job of a tree and its depth (the root is 0)."""

    row: q.Row
    depth: int

    @property
    def indent(self) -> int:
        return min(self.depth, MAX_INDENT)


def _tree(rows: list[q.Row], root_id: int) -> tuple[list[Node], bool]:
    """The tree in display order (depth first, children by id); whether it was cut."""
    cut = len(rows) > jq.TREE_LIMIT
    by_parent: dict[int | None, list[q.Row]] = {}
    for r in rows[: jq.TREE_LIMIT]:
        by_parent.setdefault(None if r.id == root_id else r.parent_id, []).append(r)
    out: list[Node] = []
    stack = [(r, 0) for r in reversed(by_parent.get(None, []))]
    while stack:
        row, depth = stack.pop()
        out.append(Node(row, depth))
        stack.extend((c, depth + 1) for c in reversed(by_parent.get(row.id, [])))
    return out, cut


def _shown(row: q.Row, shown: Redaction) -> q.Row:
    """The job's args and result as the page shows them (``result``: ``results[0]`` of a
    single result; ``has_result``: whether there is one)."""
    results = row.values.pop("results")
    row.values["has_result"] = results is not None
    single = isinstance(results, list) and len(results) == 1
    row.values["result"] = shown.value(results[0] if single else results) if results is not None else None
    row.values["args"] = shown.value(row.args)
    return row


def job(conn: Connection, job_id: int, settings: Settings) -> Screen:
    row = jq.job(conn, job_id)
    if row is None:
        raise NotFound(f"no job has the id {job_id}")
    shown = settings.redaction
    root_id = int(row.root_id or row.id)
    nodes, cut = _tree(jq.tree(conn, root_id, shown.whole), root_id)
    for n in nodes:
        n.row.values["args_text"] = shown.text(n.row.args_text, 200)
        n.row.values["results_text"] = shown.text(n.row.results_text, 200)
    durable = durable_view.of_jobs(conn, [job_id])[job_id]
    for step in durable.steps:
        if step["kind"] != "sleep" and not step["error"]:
            step["result"] = shown.value(step["result"])
    awaited = {n.row.id: n.row for n in nodes}
    return Screen(
        "job.html",
        f"Job {job_id}",
        context={"job_id": job_id},
        fragments={
            "job": ("fragments/job_fields.html", {"job": _shown(row, shown)}),
            "durable": ("fragments/job_durable.html", {"durable": durable}),
            "tree": ("fragments/job_tree.html", {
                "nodes": nodes, "cut": cut, "current": job_id, "awaited": awaited,
                "limit": jq.TREE_LIMIT,
            }),
        },
    )


# -- schedules and limits --------------------------------------------------------------------


def schedules(conn: Connection) -> Screen:
    return Screen(
        "schedules.html",
        "Schedules and limits",
        fragments={
            "schedules": ("fragments/schedules.html", {"schedules": q.schedules(conn)}),
            "limits": ("fragments/limits.html", {"limits": q.queue_limits(conn)}),
        },
    )


# -- history ---------------------------------------------------------------------------------


def history(conn: Connection) -> Screen:
    """The record's ranges and how long finished jobs are kept (postjob history status)."""
    settings = _history.settings(conn)
    return Screen(
        "history.html",
        "History",
        fragments={"history": ("fragments/history.html", {
            "keep": None if settings.keep is None else settings.keep.total_seconds(),
            "partition_size": settings.partition_size, "ranges": _history.status(conn),
            "size": _hot_tables.size_text})},
    )
