"""The schema ``postjob`` as SQLAlchemy 2.0 typed models.

The revisions in ``postjob_sa/alembic/versions`` create exactly this schema (a test compares
them); the state machine itself lives in the plpgsql functions those revisions install.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from postjob_sa import _tracing
from postjob_sa.errors import InvalidJobState

SCHEMA = "postjob"
#: What a job gets when neither the call nor its workflow's decorator says.
DEFAULT_QUEUE = "q"
DEFAULT_MAX_ATTEMPTS = 5
MANUAL_WORKFLOW = "__manual__"


class Status(enum.StrEnum):
    """The states of a job. ``ok``, ``failed``, ``timeout`` and ``cancelled`` are final."""

    ready = "ready"
    processing = "processing"
    sleep = "sleep"
    failed = "failed"
    err = "err"
    timeout = "timeout"
    ok = "ok"
    cancelled = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({Status.ok, Status.failed, Status.timeout, Status.cancelled})

metadata = MetaData(schema=SCHEMA)


class Base(DeclarativeBase):
    """Declarative base of the ``postjob`` schema (keep it apart from the host's own base)."""

    metadata = metadata


_status_type = Enum(
    Status,
    name="statuses",
    schema=SCHEMA,
    values_callable=lambda e: [m.value for m in e],
    create_type=False,
)


class Job(Base):
    """One run of a workflow: a row of ``postjob.postjobs``.

    ``session.add(Job(workflow="name", args=[...]))`` enqueues a job; the database fills in
    root_id, full_id and the deadline.
    """

    __tablename__ = "postjobs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    parent_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("postjob.postjobs.id", ondelete="CASCADE")
    )
    root_id: Mapped[int | None] = mapped_column(BigInteger)
    full_id: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
    queue: Mapped[str] = mapped_column(String, server_default=DEFAULT_QUEUE, nullable=False)
    workflow: Mapped[str] = mapped_column(String, nullable=False)
    workflow_method: Mapped[str] = mapped_column(String, server_default="run", nullable=False)
    workflow_version: Mapped[str] = mapped_column(String, server_default="", nullable=False)
    args: Mapped[list[Any]] = mapped_column(
        JSONB, server_default=text("'[]'::jsonb"), nullable=False
    )
    status: Mapped[Status] = mapped_column(
        _status_type, server_default=Status.ready.value, nullable=False
    )
    next_run_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    timeout: Mapped[float | None] = mapped_column(Double)
    timing_out_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failed_attempts: Mapped[int] = mapped_column(Integer, server_default="0", nullable=False)
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=str(DEFAULT_MAX_ATTEMPTS), nullable=False)
    results: Mapped[Any | None] = mapped_column(JSONB(none_as_null=True))
    error: Mapped[str | None] = mapped_column(String)
    error_message: Mapped[str | None] = mapped_column(String)
    error_backtrace: Mapped[list[str] | None] = mapped_column(JSONB(none_as_null=True))
    workflow_status: Mapped[str | None] = mapped_column(String)
    tags: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    awaiting_id: Mapped[int | None] = mapped_column(BigInteger)
    processing_client: Mapped[str | None] = mapped_column(String)
    processing_client_identifier: Mapped[str | None] = mapped_column(String)
    processing_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    processing_max_duration: Mapped[float | None] = mapped_column(Double)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_token: Mapped[int | None] = mapped_column(BigInteger)
    #: the worker (``postjob.workers``) running the job, while it is processing
    worker_id: Mapped[int | None] = mapped_column(BigInteger)
    #: checkout takes higher priorities first, then the earliest due
    priority: Mapped[int] = mapped_column(Integer, server_default="0", nullable=False)
    #: while a job holding this key is unfinished, enqueuing the key again returns that job
    unique_key: Mapped[str | None] = mapped_column(String)

    #: true while the job is unfinished and has a unique_key: it holds the key
    unique_key_held: Mapped[bool] = mapped_column(Boolean, server_default=text("false"),
                                                  nullable=False)
    #: the W3C trace context of the enqueue, when OpenTelemetry traced it, else of the job's
    #: first run (a child: its spawning run's; see postjob_sa._tracing)
    trace_context: Mapped[dict[str, str] | None] = mapped_column(JSONB(none_as_null=True),
                                                                 default=_tracing.carrier)

    # Only columns an ordinary run never changes are indexed, so its updates are HOT (see
    # postjob_sa/sql/schema.sql); what checkout and reaping look up is in Waiting and Lease.
    __table_args__ = (
        # one child per (parent, workflow, method, args); also serves parent_id lookups
        Index(
            "postjobs_child_key_idx",
            "parent_id",
            "workflow",
            "workflow_method",
            text("md5(args::text)"),
            unique=True,
            postgresql_where=text("parent_id IS NOT NULL"),
        ),
        # trees (children only: a root is found by its id)
        Index(
            "postjobs_tree_idx",
            "root_id",
            "full_id",
            postgresql_ops={"full_id": "text_pattern_ops"},
            postgresql_where=text("parent_id IS NOT NULL"),
        ),
        Index(
            "postjobs_tags_idx",
            "tags",
            postgresql_using="gin",
            postgresql_ops={"tags": "jsonb_path_ops"},
            postgresql_where=text("tags IS NOT NULL"),
        ),
        # one unfinished job per unique key
        Index("postjobs_unique_key_idx", "unique_key", unique=True,
              postgresql_where=text("unique_key_held")),
        # the jobs with an error: failed, timed out, cancelled, or waiting for a retry
        Index("postjobs_errors_idx", "id", postgresql_where=text("error IS NOT NULL")),
        {"schema": SCHEMA},
    )

    def result(self) -> Any:
        """The result of a job that ended ``ok`` (``results[0]``).

        A job that has not ended ``ok`` has no result: InvalidJobState says why. The state is
        the one this object was loaded with: after a worker ran the job, read it again
        (``session.refresh(job)``, or a new session)."""
        status = self.status
        if status is None:  # added to a session, not flushed yet
            raise InvalidJobState("this job has not been written yet: it has no result")
        if status is Status.ok:
            return self.results[0] if isinstance(self.results, list) and self.results else None
        if status in FINAL_STATUSES:
            raise InvalidJobState(f"job {self.id} ended {status.value}, without a result: "
                                  f"{self.error or ''}: {self.error_message or ''}".rstrip(": "))
        raise InvalidJobState(
            f"job {self.id} is {status.value}: it has no result yet. A worker runs it once the "
            "transaction that enqueued it has committed (in tests: JobQueue(session).drain()); "
            "then read it again (session.refresh(job)) and call job.result()"
        )

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.workflow} {self.status.value if self.status else None}>"


class Token(Base):
    """The secret that finishes a manual job (see ``JobQueue.resolve``)."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    postjob_id: Mapped[int] = mapped_column(
        BigInteger,
        ForeignKey("postjob.postjobs.id", ondelete="CASCADE"),
        nullable=False,
        unique=True,
    )
    token: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )

    __table_args__ = ({"schema": SCHEMA},)


class Worker(Base):
    """A running worker, kept alive by its heartbeat: a row of ``postjob.workers``.

    A job whose worker still beats is never presumed abandoned, whatever its own lease says.
    """

    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    identifier: Mapped[str] = mapped_column(String, nullable=False)
    started_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
    heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    #: the schema revision the worker's code was written for
    code_revision: Mapped[str] = mapped_column(String, nullable=False)
    workflows: Mapped[list[str]] = mapped_column(
        ARRAY(Text), server_default=text("'{}'::text[]"), nullable=False
    )
    #: the queues it serves; None: all
    queues: Mapped[list[str] | None] = mapped_column(ARRAY(Text))

    __table_args__ = ({"schema": SCHEMA},)


class QueueLimit(Base):
    """Limits of one queue, obeyed by every worker's checkout: a row of ``postjob.queue_limits``.

    ``concurrency``: at most this many of its jobs processing at once; ``rate``: at most this
    many starts in any ``period`` seconds. None: no such limit. Set them with
    ``JobQueue.set_queue_limits`` or ``postjob queue limit``.
    """

    __tablename__ = "queue_limits"

    queue: Mapped[str] = mapped_column(String, primary_key=True)
    concurrency: Mapped[int | None] = mapped_column(Integer)
    rate: Mapped[int | None] = mapped_column(Integer)
    period: Mapped[float] = mapped_column(Double, server_default="1", nullable=False)
    #: the starts of the last period, by slot of period/20 seconds (checkout keeps them)
    rate_slots: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), server_default=text("'{}'::bigint[]"), nullable=False
    )
    rate_counts: Mapped[list[int]] = mapped_column(
        ARRAY(Integer), server_default=text("'{}'::integer[]"), nullable=False
    )
    #: the ids the concurrency limit counts (its queue's jobs checked out while limited; None
    #: until a checkout first reads them from the table): checkout keeps them
    processing_ids: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )

    __table_args__ = (
        CheckConstraint("concurrency IS NULL OR concurrency >= 0",
                        name="queue_limits_concurrency_range"),
        CheckConstraint("rate IS NULL OR rate >= 0", name="queue_limits_rate_range"),
        CheckConstraint("period > 0", name="queue_limits_period_positive"),
        {"schema": SCHEMA},
    )


class Waiting(Base):
    """A job that waits: to run (due now, or at ``run_at``), for its children, or for a token.

    One row per such job, written by the database's functions and triggers (never by hand):
    checkout reads only its index of due jobs. Its status, workflow, queue and priority are the
    job's own."""

    __tablename__ = "waiting"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    status: Mapped[Status] = mapped_column(_status_type, nullable=False)
    workflow: Mapped[str] = mapped_column(String, nullable=False)
    workflow_version: Mapped[str] = mapped_column(String, nullable=False)
    queue: Mapped[str] = mapped_column(String, nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    #: when it may run; None while it waits for children or a token
    run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: checkout may take it now
    due: Mapped[bool] = mapped_column(Boolean, nullable=False)
    timing_out_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("waiting_due_idx", "workflow", "workflow_version", "queue", text("priority DESC"),
              "run_at", "job_id", postgresql_where=text("due")),
        Index("waiting_scheduled_idx", "workflow", "workflow_version", "run_at",
              postgresql_where=text("NOT due AND run_at IS NOT NULL")),
        Index("waiting_timeout_idx", "timing_out_at",
              postgresql_where=text("timing_out_at IS NOT NULL")),
        CheckConstraint("status IN ('ready', 'err', 'sleep')", name="waiting_status"),
        CheckConstraint("NOT due OR run_at IS NOT NULL", name="waiting_due_has_time"),
        {"schema": SCHEMA},
    )


class Lease(Base):
    """A checkout whose jobs may still be running: the token they carry, the worker holding
    them (None: a checkout through the API, held until ``expires_at``) and their ids."""

    __tablename__ = "leases"

    token: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    worker_id: Mapped[int | None] = mapped_column(BigInteger)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    job_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), nullable=False)

    __table_args__ = (
        Index("leases_worker_idx", "worker_id"),
        {"schema": SCHEMA},
    )


class QueueSlot(Base):
    """One of a limited queue's places: taken by a job while it runs (``job_id``)."""

    __tablename__ = "queue_slots"

    queue: Mapped[str] = mapped_column(
        String, ForeignKey("postjob.queue_limits.queue", ondelete="CASCADE"), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index("queue_slots_job_idx", "job_id", postgresql_where=text("job_id IS NOT NULL")),
        {"schema": SCHEMA},
    )


class QueueStart(Base):
    """One of a rate-limited queue's starts: free again once ``started_at`` is a period old."""

    __tablename__ = "queue_starts"

    queue: Mapped[str] = mapped_column(
        String, ForeignKey("postjob.queue_limits.queue", ondelete="CASCADE"), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("queue_starts_oldest_idx", "queue", text("started_at NULLS FIRST")),
        {"schema": SCHEMA},
    )


class Schedule(Base):
    """A periodic workflow (``@workflow(cron=...)`` or ``@workflow(every=...)``) as the workers
    registered it: a row of ``postjob.schedules``, with its last and next tick."""

    __tablename__ = "schedules"

    #: the workflow's name
    name: Mapped[str] = mapped_column(String, primary_key=True)
    cron: Mapped[str | None] = mapped_column(String)
    timezone: Mapped[str | None] = mapped_column(String)
    every: Mapped[float | None] = mapped_column(Double)
    skip_missed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"), nullable=False)
    #: the last tick handled (its job enqueued, or skipped)
    last_tick_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    next_tick_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: the last tick that enqueued a job, and that job
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)
    registered_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )

    __table_args__ = (
        CheckConstraint("(cron IS NULL) <> (every IS NULL)", name="schedules_cron_or_every"),
        {"schema": SCHEMA},
    )
