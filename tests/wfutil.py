"""Helpers shared by the workflow tests: read job rows straight from the database."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session


def row(session: Session, job_id: int) -> dict[str, Any]:
    """The job's row as committed now (a fresh statement: READ COMMITTED)."""
    session.commit()
    r = session.execute(
        text(
            "SELECT id, parent_id, root_id, full_id, workflow, args, status::text AS status, "
            "results, error, error_message, failed_attempts, workflow_status, awaiting_id, "
            "lease_token FROM postjob.jobs WHERE id = :id"
        ),
        {"id": job_id},
    ).mappings().one()
    return dict(r)


def children(session: Session, parent_id: int) -> list[dict[str, Any]]:
    session.commit()
    rows = session.execute(
        text(
            "SELECT id, workflow, args, status::text AS status, results, error, error_message "
            "FROM postjob.jobs WHERE parent_id = :p ORDER BY id"
        ),
        {"p": parent_id},
    ).mappings().all()
    return [dict(r) for r in rows]


def count_jobs(session: Session) -> int:
    session.commit()
    return int(session.execute(text("SELECT count(*) FROM postjob.jobs")).scalar_one())


def result(session: Session, job_id: int) -> Any:
    r = row(session, job_id)
    assert r["status"] == "ok", r
    return r["results"][0]
