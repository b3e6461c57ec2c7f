"""Per-queue limits as operators set them (``JobQueue.set_queue_limits``, ``postjob queue
limit``); checkout (``postjob_sa/sql/checkout.sql``) obeys them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from postjob_sa import _session_sql
from postjob_sa.models import QueueLimit


def set_limits(session: Session, queue: str, concurrency: int | None, rate: int | None,
               period: float | None) -> None:
    """Write a queue's limits in the caller's transaction; both None: drop them."""
    if concurrency is None and rate is None:
        session.execute(_session_sql.QUEUE_LIMITS_DELETE, {"queue": queue})
        return
    session.execute(_session_sql.QUEUE_LIMITS_SET, {"queue": queue, "concurrency": concurrency,
                                            "rate": rate, "period": period or 1.0})


def list_limits(session: Session) -> list[QueueLimit]:
    return list(session.scalars(select(QueueLimit).order_by(QueueLimit.queue)))


def report(session: Session) -> list[dict[str, Any]]:
    """Each limited queue with its processing jobs and its starts in the last period."""
    return [dict(r) for r in session.execute(_session_sql.QUEUE_LIMITS_REPORT).mappings()]
