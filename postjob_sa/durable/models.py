"""The tables of durable workflows as models (see postjob_sa/sql/schema.sql): a job's steps,
the events and the jobs waiting for one. Written by the database's functions (durable.sql),
read by ``postjob ps show`` and the dashboard."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, DateTime, Index, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from postjob_sa.models import SCHEMA, Base


class Step(Base):
    """What a run of a job did that its re-runs must not do again: a step (``kind`` 'step',
    by its name), a sleep or a wait for an event (the n-th of its run: ``name`` n)."""

    __tablename__ = "steps"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    #: a step's arguments (md5 of their JSON); an event wait's key
    digest: Mapped[str | None] = mapped_column(String)
    #: [value] of a step, [payload] of an event
    result: Mapped[Any | None] = mapped_column(JSONB(none_as_null=True))
    #: a step's non-recoverable error, or EventTimeout
    error: Mapped[str | None] = mapped_column(String)
    error_message: Mapped[str | None] = mapped_column(String)
    #: when a sleep ends
    wake_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = (
        CheckConstraint("kind IN ('step', 'sleep', 'event')", name="steps_kind"),
        {"schema": SCHEMA},
    )


class Event(Base):
    """An event (``JobQueue.emit_event``): a wait gets the first one under its key."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    key: Mapped[str] = mapped_column(String, nullable=False)
    payload: Mapped[Any | None] = mapped_column(JSONB(none_as_null=True))
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = (
        Index("events_key_idx", "key", "id"),
        {"schema": SCHEMA},
    )


class EventWait(Base):
    """A job waiting for an event: the ``seq``-th wait of its run, for ``key``, until
    ``timeout_at`` (None: no deadline)."""

    __tablename__ = "event_waits"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String, primary_key=True)
    timeout_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = (
        Index("event_waits_key_idx", "key"),
        {"schema": SCHEMA},
    )
