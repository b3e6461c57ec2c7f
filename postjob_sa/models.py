"""The schema ``postjob`` as SQLAlchemy 2.0 typed models.

The revisions in ``postjob_sa/alembic/versions`` create exactly this schema (a test compares
them); the state machine itself lives in the plpgsql functions those revisions install. The
narrow tables are in ``postjob_sa._tables``; both are here by name.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Double,
    Index,
    Integer,
    String,
    case,
    exists,
    func,
    literal,
    text,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import Mapped, configure_mappers, mapped_column, relationship
from sqlalchemy.orm.attributes import instance_dict

from postjob_sa import _tracing
from postjob_sa._schema_base import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    FINAL_STATUSES,
    MANUAL_WORKFLOW,
    SCHEMA,
    WAITING_STATUSES,
    Base,
    Status,
    metadata,
    status_type,
)
from postjob_sa._tables import (
    EventKey,
    HistoryRangeCheck,
    HistorySettingsRecord,
    Lease,
    QueueLimit,
    QueueSlot,
    QueueStart,
    Schedule,
    SettledCount,
    Unfinished,
    Waiting,
    Wakeup,
    Worker,
)
from postjob_sa.errors import InvalidJobState

__all__ = ["DEFAULT_MAX_ATTEMPTS", "DEFAULT_QUEUE", "FINAL_STATUSES", "MANUAL_WORKFLOW", "SCHEMA",
           "HistoryRangeCheck", "HistorySettingsRecord",
           "WAITING_STATUSES", "Base", "EventKey", "Job", "Lease", "QueueLimit", "QueueSlot",
           "QueueStart", "Schedule", "SettledCount", "Status", "Token", "Unfinished", "Waiting", "Wakeup",
           "Worker",
           "metadata", "status_type"]


class Job(Base):
    """One run of a workflow: a row of ``postjob.postjobs``.

    ``session.add(Job(workflow="name", args=[...]))`` enqueues a job; the database fills in
    root_id, full_id and the deadline. ``status`` is the job's status as the queue sees it:
    ``processing`` while a run holds its lease (the record keeps the status the job had
    before, ``recorded_status``; a worker's checkout does not write the record), and its
    ``lease_token``, ``lease_expires_at`` and ``worker_id`` are the running lease's. They are
    loaded with the job (a join of its row in ``postjob.unfinished``).
    """

    __tablename__ = "postjobs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    #: the job that spawned it (no foreign key: the insert trigger checks it, and a job's
    #: children go with it by the delete trigger; the record is partitioned)
    parent_id: Mapped[int | None] = mapped_column(BigInteger)
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
    #: the status the record keeps: the job's own, but while it runs (see ``status``)
    recorded_status: Mapped[Status] = mapped_column(
        "status", status_type, server_default=Status.ready.value, nullable=False
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
    # retired: the lease as pj0008 kept it in the record (NULL since pj0009)
    _retired_lease_expires_at: Mapped[datetime | None] = mapped_column(
        "lease_expires_at", DateTime(timezone=True))
    _retired_lease_token: Mapped[int | None] = mapped_column("lease_token", BigInteger)
    _retired_worker_id: Mapped[int | None] = mapped_column("worker_id", BigInteger)
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
    #: the inserting statement queued the job itself (postjob_sa's enqueue); else the trigger
    _queued: Mapped[bool] = mapped_column("queued", Boolean, server_default=text("false"),
                                          nullable=False)
    #: the job's row in postjob.unfinished (None: it is finished)
    unfinished: Mapped[Unfinished | None] = relationship(
        Unfinished, primaryjoin="Job.id == foreign(Unfinished.job_id)", viewonly=True,
        lazy="joined", uselist=False)

    # Only columns an ordinary run never changes are indexed, so its updates are HOT (see
    # postjob_sa/sql/schema.sql); what checkout and reaping look up is in Waiting and Lease.
    __table_args__ = (
        # a parent's children, by (workflow, method, args): what spawn looks up
        Index(
            "postjobs_children_idx",
            "parent_id",
            "workflow",
            "workflow_method",
            text("md5(args::text)"),
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
        # the jobs with an error: failed, timed out, cancelled, or waiting for a retry
        Index("postjobs_errors_idx", "id", postgresql_where=text("error IS NOT NULL")),
        # ranges of job ids (postjob_sa/sql/history.sql makes and drops them)
        {"schema": SCHEMA, "postgresql_partition_by": "RANGE (id)"},
    )

    def __init__(self, **values: Any) -> None:
        """``Job(workflow=..., args=[...], ...)``: the columns by name (``status`` sets the
        recorded status)."""
        if "status" in values:  # not through the hybrid: its class expression is built per look
            values["recorded_status"] = values.pop("status")
        super().__init__(**values)

    @classmethod
    def _as_written(cls, values: dict[str, Any]) -> Job:
        """A persistent-to-be Job holding these values as loaded (no history, nothing to
        flush), for a row a statement of ours just wrote; what is not given loads on first
        access (``make_transient_to_detached`` expires it)."""
        if not cls.__mapper__.configured:  # what a constructor's first call does
            configure_mappers()
        job: Job = cls.__mapper__.class_manager.new_instance()
        instance_dict(job).update(values)
        return job

    @hybrid_property
    def status(self) -> Status:
        """``processing`` while a run holds the job's lease, else the recorded status."""
        row = self.unfinished
        if row is not None and row.lease_token is not None and row.status in WAITING_STATUSES:
            return Status.processing
        return self.recorded_status

    @status.inplace.setter
    def _status_setter(self, value: Status) -> None:
        self.recorded_status = value

    @status.inplace.expression
    @classmethod
    def _status_expression(cls) -> ColumnElement[Status]:
        running = exists().where(Unfinished.job_id == cls.id, Unfinished.lease_token.is_not(None),
                                 Unfinished.status.in_(sorted(WAITING_STATUSES)))
        return case((running, type_coerce(literal(Status.processing.value), status_type)),
                    else_=cls.recorded_status)

    @property
    def lease_token(self) -> int | None:
        """The token of the lease a run holds the job under (None: not running)."""
        row = self.unfinished
        return None if row is None else row.lease_token

    @property
    def lease_expires_at(self) -> datetime | None:
        """When the running lease ends unless its worker beats (a checkout through the API:
        when it ends)."""
        row = self.unfinished
        return None if row is None else row.lease_expires_at

    @property
    def worker_id(self) -> int | None:
        """The worker (``postjob.workers``) running the job, while it runs."""
        row = self.unfinished
        return None if row is None else row.worker_id

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
    #: the job (no foreign key: removed with it, see postjob_sa/sql/jobs.sql)
    postjob_id: Mapped[int] = mapped_column(BigInteger, nullable=False, unique=True)
    token: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )

    __table_args__ = ({"schema": SCHEMA},)


