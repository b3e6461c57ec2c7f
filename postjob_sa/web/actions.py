"""The operator's actions. Each goes through the public ``JobQueue`` API in a transaction of
its own, so its validation applies exactly as for the CLI and the application."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import Session
from werkzeug.datastructures import MultiDict

from postjob_sa.queue import JobQueue

from . import forms

#: What the page says after an action (the redirect carries the key, never free text).
DONE = {
    "reset": "Reset: the job (and its failed descendants) will run again.",
    "force": "Forced: the job runs as soon as a worker is free.",
    "cancelled": "Cancelled: the job and its unfinished descendants will not run; a run in "
                 "progress is told at its next write and abandoned.",
    "resolved": "Resolved: the manual step is done and its parent wakes.",
    "failed": "Failed: the manual step failed with your message; its parent wakes.",
}


def reset(engine: Engine, job_id: int) -> str:
    with Session(engine) as session:
        JobQueue(session).reset(job_id)
        session.commit()
    return "reset"


def force(engine: Engine, job_id: int) -> str:
    with Session(engine) as session:
        JobQueue(session).force(job_id)
        session.commit()
    return "force"


def cancel(engine: Engine, job_id: int) -> str:
    with Session(engine) as session:
        JobQueue(session).cancel(job_id)
        session.commit()
    return "cancelled"


def resolve(engine: Engine, form: MultiDict[str, str]) -> tuple[int, str]:
    """Finish a manual step from the resolve form; returns (its job id, what happened)."""
    wanted = forms.resolution(form)
    with Session(engine) as session:
        job_id = JobQueue(session).resolve(wanted.token, wanted.value, error=wanted.error)
        session.commit()
    return job_id, "failed" if wanted.error is not None else "resolved"
