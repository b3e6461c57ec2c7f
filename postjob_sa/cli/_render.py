"""Rendering for humans (aligned rich tables, colours only on a terminal) and for scripts
(``--json``). Nothing here talks to the database."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from postjob_sa.durable import view as durable_view
from postjob_sa.models import MANUAL_WORKFLOW, Job
from postjob_sa.worker.unknown import Served

from ._widths import GAP, cut_left, cut_words, fit

STATUS_STYLES = {
    "ok": "green", "failed": "bold red", "timeout": "red", "err": "yellow",
    "processing": "cyan", "sleep": "blue", "ready": "", "cancelled": "magenta",
}
#: How ps shows a manual step that waits (its status is ready): a person finishes it.
AWAITS_TOKEN = "awaits token"
#: Added to the status of a waiting job whose workflow no running worker knows.
NO_WORKER = "(no worker)"
PS_COLUMNS = (
    "id", "workflow", "status", "attempts", "result", "next_run_in", "age", "processing",
    "worker", "tags",
)
#: The headers of the columns that are not named as they are shown.
HEADERS = {"attempts": "failed/max"}  # failed attempts of the most the job has
#: Columns left out of a table where every row has them empty.
_OPTIONAL = frozenset({"result", "next_run_in", "processing", "worker", "tags"})


def console(*, stderr: bool = False) -> Console:
    """A console that wraps to the terminal, or to $COLUMNS (default 120) when piped."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    width = None if tty else int(os.environ.get("COLUMNS") or shutil.get_terminal_size((120, 24)).columns)
    return Console(file=stream, width=width, highlight=False, soft_wrap=False, emoji=False)


def duration(seconds: float | None) -> str:
    """3m12s, 2h05m, 4d03h, -2s, 0.4s."""
    if seconds is None:
        return ""
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{s:.1f}s" if s >= 0.05 else "0s"
    whole = int(round(s))
    if whole < 60:
        return f"{sign}{whole}s"
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _seconds_between(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def result_text(row: dict[str, Any]) -> str:
    """The result of an ok job, else the error message (or the progress note)."""
    results = row.get("results")
    if row["status"] == "ok" and isinstance(results, list) and results:
        return compact_json(results[0])
    if row.get("error_message") or row.get("error"):
        return str(row.get("error_message") or row.get("error"))
    return str(row.get("workflow_status") or "")


def tags_text(tags: dict[str, Any] | None) -> str:
    return ",".join(f"{k}:{v}" for k, v in sorted((tags or {}).items()))


def status_text(row: dict[str, Any], served: Served | None) -> str:
    """The status as ps shows it: a waiting manual step awaits its token; a waiting job
    whose workflow no running worker knows says so."""
    status = str(row["status"])
    if row["workflow"] == MANUAL_WORKFLOW and status == "ready":
        return AWAITS_TOKEN
    if served is not None and served.unknown(row["workflow"], status):
        return f"{status} {NO_WORKER}"
    return status


def ps_fields(row: dict[str, Any], *, full_id: bool = False, served: Served | None = None) -> dict[str, str]:
    """One job as the strings of the ps columns."""
    now = row["db_now"]
    processing = ""
    if row["status"] == "processing" and row["processing_started_at"] is not None:
        lease = row["processing_max_duration"]
        processing = duration(_seconds_between(now, row["processing_started_at"])) + (
            f"/{duration(lease)}" if lease else ""
        )
    worker = ""
    if row["processing_client"] or row["processing_client_identifier"]:
        worker = f"{row['processing_client'] or ''}/{row['processing_client_identifier'] or ''}"
    version = row["workflow_version"]
    return {
        "id": str(row["full_id"] if full_id else row["id"]),
        "workflow": row["workflow"] + (f"@{version}" if version else ""),
        "status": status_text(row, served),
        "attempts": f"{row['failed_attempts']}/{row['max_attempts']}",
        "result": result_text(row),
        "next_run_in": duration(_seconds_between(row["next_run_at"], now)),
        "age": duration(_seconds_between(now, row["created_at"])),
        "processing": processing,
        "worker": worker,
        "tags": tags_text(row["tags"]),
    }


#: Columns that give way when the terminal is narrow, with their widest (the others keep
#: their natural width).
_FLEXIBLE = {"workflow": 48, "result": 48, "worker": 40, "tags": 32}
#: The workflow column keeps at least this much (a name cut short says nothing); it is cut
#: on the left, so the function's own name shows.
_WORKFLOW_MIN = 24


def _fit(natural: dict[str, int], width: int) -> dict[str, int]:
    """Column widths of a ps table of this total width (the workflow column never under
    its floor)."""
    return fit(natural, width, _FLEXIBLE, {"workflow": _WORKFLOW_MIN})


def ps_table(rows: list[dict[str, Any]], *, width: int, full_id: bool = False,
             served: Served | None = None) -> Table:
    """The ps table at this width. A column that is empty in every row is left out (its room
    goes to the others); the workflow column keeps the end of a long name."""
    all_fields = [ps_fields(row, full_id=full_id, served=served) for row in rows]
    columns = [c for c in PS_COLUMNS if c not in _OPTIONAL or any(f[c] for f in all_fields)]
    natural = {n: max([len(HEADERS.get(n, n)), *(len(f[n]) for f in all_fields)]) for n in columns}
    widths = _fit(natural, width)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name in columns:
        table.add_column(
            HEADERS.get(name, name), no_wrap=True, overflow="ellipsis", width=widths[name],
            min_width=widths[name] if name in ("id", "workflow", "status") else None,
            justify="right" if name in ("id", "attempts", "next_run_in", "age") else "left",
        )
    for fields in all_fields:
        fields["workflow"] = cut_left(fields["workflow"], widths["workflow"])
        table.add_row(*[Text(fields[c], style=_status_style(fields[c]) if c == "status" else "")
                        for c in columns])
    return table


def _status_style(shown: str) -> str:
    if shown.endswith(NO_WORKER):
        return "bold yellow"
    return "magenta" if shown == AWAITS_TOKEN else STATUS_STYLES.get(shown, "")


def no_worker_note(rows: list[dict[str, Any]], served: Served) -> str | None:
    """What the "(no worker)" marks of these rows mean, or None when there are none."""
    names = sorted({r["workflow"] for r in rows if served.unknown(r["workflow"], r["status"])})
    if not names:
        return None
    if not served.workers:
        return ("(no worker): no worker is running, so nothing runs these jobs; start one: "
                "postjob run --import MODULE")
    them = "it" if len(names) == 1 else "them"
    return (f"(no worker): none of the {served.workers} running worker"
            f"{'' if served.workers == 1 else 's'} knows {', '.join(names)}; start a worker "
            f"that imports {them} (postjob run --import MODULE) or fix the name"
            f"{'' if len(names) == 1 else 's'}")


def json_ready(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def ps_json(row: dict[str, Any], served: Served | None = None) -> dict[str, Any]:
    """A job for scripts: raw fields plus the computed seconds of the ps columns, and
    ``no_worker``: it waits for a workflow no running worker knows."""
    now = row["db_now"]
    out = {k: v for k, v in row.items() if k != "db_now"}
    out["next_run_in"] = _seconds_between(row["next_run_at"], now)
    out["age"] = _seconds_between(now, row["created_at"])
    out["processing_for"] = (
        _seconds_between(now, row["processing_started_at"]) if row["status"] == "processing" else None
    )
    out["result"] = row["results"][0] if row["status"] == "ok" and row["results"] else None
    out["no_worker"] = served is not None and served.unknown(row["workflow"], row["status"])
    return json_ready(out)  # type: ignore[no-any-return]


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(json_ready(value), indent=2, ensure_ascii=False) + "\n")


def job_fields(job: Job, token: str | None) -> dict[str, Any]:
    """Every column of a job (and its token, for a manual job)."""
    out: dict[str, Any] = {c.key: getattr(job, c.key) for c in Job.__mapper__.column_attrs}
    out["status"] = job.status.value
    out["token"] = token
    return out


def show_table(fields: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE, show_header=False, show_edge=False, pad_edge=False,
                  title=f"job {fields['full_id'] or fields['id']}", title_justify="left",
                  title_style="bold")
    table.add_column("field", style="dim", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in fields.items():
        if key == "error_backtrace" and value:
            shown = "\n".join(str(v) for v in value)
        elif key == "steps":
            shown = "\n".join(durable_view.describe(step) for step in value)
        elif key == "waits_for_events":
            shown = "\n".join(durable_view.describe_wait(wait) for wait in value)
        elif isinstance(value, datetime):
            shown = value.isoformat(sep=" ", timespec="milliseconds")
        elif isinstance(value, (dict, list)):
            shown = compact_json(value)
        else:
            shown = "" if value is None else str(value)
        style = STATUS_STYLES.get(shown, "") if key == "status" else ""
        table.add_row(key, Text(shown, style=style))
    return table


#: Most of a job's args a tree shows, and the least worth showing beside its workflow.
_ARGS_MAX, _ARGS_MIN = 40, 8
#: How wide a tree's results may grow before its args are shown.
_RESULT_CAP = 40


def _tree_label(indent: str, job_id: int, workflow: str, args: str, width: int) -> Text:
    """A tree's job cell in ``width``: indentation and id, the workflow (its end kept),
    then as much of the args as fits."""
    label = Text(indent)
    label.append(f"{job_id} ", style="bold")
    used = len(label.plain)
    name = cut_left(workflow, width - used)
    label.append(name)
    room = width - used - len(name) - 1
    if args and room >= _ARGS_MIN:
        label.append(" " + cut_words(args, min(room, _ARGS_MAX)), style="dim")
    return label


def _tree_widths(rows: list[tuple[str, int, dict[str, str], str]], width: int) -> dict[str, int]:
    """The columns of a tree in ``width``: status, attempts and age whole; the job column
    and the results share the rest (the workflows never under their floor), then the args
    and the rest of long results take what remains."""
    widths = {name: len(HEADERS.get(name, name)) for name in _TREE_COLUMNS}
    core = with_args = widths["job"]
    for indent, job_id, fields, args in rows:
        named = len(f"{indent}{job_id} ") + len(fields["workflow"])
        core = max(core, named)
        with_args = max(with_args, named + (1 + min(len(args), _ARGS_MAX) if args else 0))
        for name in _TREE_COLUMNS[1:]:
            widths[name] = max(widths[name], len(fields[name]))
    floor = max(len(f"{i}{j} ") + min(len(f["workflow"]), _WORKFLOW_MIN) for i, j, f, _ in rows)
    left = width - sum(widths[n] for n in ("status", "attempts", "age")) - GAP * 4
    result = widths["result"]
    widths["job"] = min(core, max(floor, left // 2, left - result))
    widths["result"] = max(min(result, _RESULT_CAP, left - widths["job"]), min(result, 4))
    widths["job"] = max(widths["job"], min(with_args, left - widths["result"]))
    widths["result"] = max(widths["result"], min(result, left - widths["job"]))
    return widths


_TREE_COLUMNS = ("job", "status", "attempts", "result", "age")


def tree_table(tree: list[dict[str, Any]], served: Served | None = None,
               width: int = 120) -> Table:
    """One job tree, children indented under their parents, one line per job in ``width``:
    the workflow keeps its end, args and result give way first (cut between words)."""
    base = len(str(tree[0]["full_id"]).split("."))
    rows = []
    for row in tree:
        depth = len(str(row["full_id"]).split(".")) - base
        indent = "  " * depth + ("└ " if depth else "")
        args = compact_json(row["args"]) if row["args"] else ""
        rows.append((indent, int(row["id"]), ps_fields(row, full_id=True, served=served), args))
    widths = _tree_widths(rows, width)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name in _TREE_COLUMNS:
        table.add_column(HEADERS.get(name, name), no_wrap=True, overflow="ellipsis",
                         width=widths[name], min_width=widths[name],
                         justify="right" if name in ("attempts", "age") else "left")
    for indent, job_id, fields, args in rows:
        table.add_row(
            _tree_label(indent, job_id, fields["workflow"], args, widths["job"]),
            Text(fields["status"], style=_status_style(fields["status"])),
            fields["attempts"], cut_words(fields["result"], widths["result"]), fields["age"],
        )
    return table


def trees(all_trees: list[list[dict[str, Any]]], served: Served | None = None,
          width: int = 120) -> Group:
    """The trees, one after the other (the note about jobs no worker runs is ps's to print)."""
    return Group(*[tree_table(t, served, width) for t in all_trees])


_SCHEDULE_COLUMNS = ("workflow", "schedule", "missed", "last run", "job", "status", "next run")
#: A schedule's workflow keeps at least this much (its schedule needs room too).
_SCHEDULE_WORKFLOW_MIN = 20


def _schedule_fields(row: dict[str, Any], now: datetime) -> dict[str, str]:
    last = _seconds_between(now, row["last_run_at"])
    upcoming = _seconds_between(row["next_tick_at"], now)
    return {
        "workflow": row["name"],
        "schedule": (f"every {duration(row['every'])}" if row["every"] is not None
                     else f"{row['cron']} {row['timezone']}"),
        "missed": "skip" if row["skip_missed"] else "latest",
        "last run": "" if last is None else f"{duration(last)} ago",
        "job": "" if row["last_job_id"] is None else str(row["last_job_id"]),
        "status": row["last_status"] or "",
        "next run": ("" if upcoming is None else f"in {duration(upcoming)}" if upcoming >= 0
                     else f"overdue {duration(-upcoming)}"),
    }


def _cut_schedule(row: dict[str, Any], shown: str, width: int) -> str:
    """A cron schedule keeps its expression; its time zone keeps its end."""
    if len(shown) <= width or row["every"] is not None:
        return cut_words(shown, width)
    cron = str(row["cron"])
    return cut_words(cron, width) if len(cron) + 2 > width else (
        cron + " " + cut_left(str(row["timezone"]), width - len(cron) - 1))


def schedules_table(rows: list[dict[str, Any]], now: datetime, width: int) -> Table:
    """The periodic workflows, one line each in ``width``: the last and next runs relative
    to the database's ``now``; the workflow keeps its end, a time zone too."""
    all_fields = [_schedule_fields(r, now) for r in rows]
    natural = {n: max([len(n), *(len(f[n]) for f in all_fields)]) for n in _SCHEDULE_COLUMNS}
    floors = {"workflow": _SCHEDULE_WORKFLOW_MIN,  # a cron keeps its expression and its zone's city
              "schedule": max(len(f["schedule"]) if r["every"] is not None else
                              len(f"{r['cron']} …{str(r['timezone']).rsplit('/', 1)[-1]}")
                              for r, f in zip(rows, all_fields, strict=True))}
    widths = fit(natural, width, {"workflow": natural["workflow"],
                                  "schedule": natural["schedule"]}, floors)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in _SCHEDULE_COLUMNS:
        table.add_column(name, no_wrap=True, overflow="ellipsis", width=widths[name],
                         min_width=widths[name], justify="right" if name == "job" else "left")
    for row, fields in zip(rows, all_fields, strict=True):
        fields["workflow"] = cut_left(fields["workflow"], widths["workflow"])
        fields["schedule"] = _cut_schedule(row, fields["schedule"], widths["schedule"])
        table.add_row(*[Text(fields[n], style=STATUS_STYLES.get(fields[n], "") if n == "status"
                             else "") for n in _SCHEDULE_COLUMNS])
    return table
