"""What a job's durable calls stored, for ``postjob ps show`` and the dashboard's job page: its
steps (name, when, result or error), the time it sleeps until and the events it waits for."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

STEPS_OF_JOBS = text(
    "SELECT job_id, kind, name, created_at, digest, result, error, error_message, wake_at, "
    "wake_at > now() AS pending FROM postjob.steps WHERE job_id = ANY(CAST(:ids AS bigint[])) "
    "ORDER BY job_id, created_at, kind, name"
)
WAITS_OF_JOBS = text(
    "SELECT w.job_id, w.seq, w.key, w.timeout_at, w.created_at FROM postjob.event_waits w "
    "JOIN postjob.postjobs j ON j.id = w.job_id "
    "WHERE w.job_id = ANY(CAST(:ids AS bigint[])) "
    "AND j.status IN ('ready', 'processing', 'sleep', 'err') ORDER BY w.job_id, w.seq, w.key"
)
#: Characters of a result or payload shown (the rest is cut).
SHOWN = 200


@dataclass
class Durable:
    """One job's steps, the time its durable sleep ends (if it sleeps) and its event waits."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    sleeps_until: datetime | None = None
    waits_for: list[dict[str, Any]] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        """As ``ps show --json`` prints them."""
        return {"steps": self.steps, "sleeps_until": self.sleeps_until,
                "waits_for_events": self.waits_for}


def of_jobs(conn: Connection | Session, ids: list[int]) -> dict[int, Durable]:
    """The durable state of these jobs (two queries, whatever their number)."""
    found = {i: Durable() for i in ids}
    for r in conn.execute(STEPS_OF_JOBS, {"ids": ids}).mappings():
        d = found[int(r["job_id"])]
        d.steps.append({"kind": r["kind"], "name": r["name"], "at": r["created_at"],
                        "key": r["digest"] if r["kind"] == "event" else None,
                        "result": _value(r["result"]), "error": r["error"],
                        "message": r["error_message"], "until": r["wake_at"]})
        if r["kind"] == "sleep" and r["pending"]:
            d.sleeps_until = max(filter(None, (d.sleeps_until, r["wake_at"])))
    for r in conn.execute(WAITS_OF_JOBS, {"ids": ids}).mappings():
        found[int(r["job_id"])].waits_for.append(
            {"key": r["key"], "since": r["created_at"], "timeout_at": r["timeout_at"]})
    return found


def _value(stored: Any) -> Any:
    return stored[0] if isinstance(stored, list) and len(stored) == 1 else stored


def describe(step: dict[str, Any]) -> str:
    """One line for a step: 'step charge: {"id": 1}', 'sleep 1: until ...', 'event 1 (key): ...'."""
    if step["kind"] == "step":
        label = f"step {step['name']}"
    else:
        label = f"{step['kind']} #{step['name']}"
        if step["kind"] == "event":
            label += f" ({step['key']})"
    if step["kind"] == "sleep":
        until = step["until"]
        return f"{label}: until {until.isoformat(sep=' ', timespec='seconds') if until else '?'}"
    if step["error"] is not None:
        return f"{label}: {step['error']}: {step['message'] or ''}".rstrip(": ")
    shown = json.dumps(step["result"], ensure_ascii=False, default=str)
    return f"{label}: {shown if len(shown) <= SHOWN else shown[:SHOWN] + '…'}"


def describe_wait(wait: dict[str, Any]) -> str:
    """One line for an event wait: its key, and its deadline if it has one."""
    until = wait["timeout_at"]
    return str(wait["key"]) + (f" (until {until.isoformat(sep=' ', timespec='seconds')})" if until else "")
