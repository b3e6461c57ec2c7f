"""The narrow tables of the ``postjob`` schema: what the scheduler reads and writes beside the
job record (postjob_sa/sql/schema.sql says what each is for). Written by the database's
functions; the models are for reading them and for Alembic's comparison."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    Index,
    Integer,
    Interval,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from postjob_sa._schema_base import SCHEMA, Base, Status, status_type


class Worker(Base):
    """A running worker, kept alive by its heartbeat: a row of ``postjob.workers``.

    A job whose worker still beats is never presumed abandoned, whatever its own lease says,
    unless the worker's own direct connection is gone (its process died).
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
    #: since when it waits for work (a new job wakes the one waiting longest that serves it)
    waiting_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: the version of each of its workflows, in their order (None: every version)
    workflow_versions: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    #: its own connection's server process, when direct: once gone, the worker is dead
    backend_pid: Mapped[int | None] = mapped_column(Integer)
    backend_start: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

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


class Unfinished(Base):
    """An unfinished job's place in its queue and, while it runs, its lease: a row of
    ``postjob.unfinished``, written by the database's functions and triggers (never by hand).
    Checkout reads only its index of due jobs. Its workflow, queue and priority are the job's
    own; ``status`` is what the job waits as (see postjob_sa/sql/schema.sql)."""

    __tablename__ = "unfinished"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    status: Mapped[Status] = mapped_column(status_type, nullable=False)
    workflow: Mapped[str] = mapped_column(String, nullable=False)
    workflow_version: Mapped[str] = mapped_column(String, nullable=False)
    queue: Mapped[str] = mapped_column(String, nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    #: when it may run; None while it waits for children, an event or a token
    run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: checkout may take it now
    due: Mapped[bool] = mapped_column(Boolean, nullable=False)
    timing_out_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    parent_id: Mapped[int | None] = mapped_column(BigInteger)
    #: the unique key it holds
    unique_key: Mapped[str | None] = mapped_column(String)
    lease_token: Mapped[int | None] = mapped_column(BigInteger)
    #: the worker holding the lease (None: a checkout through the API)
    worker_id: Mapped[int | None] = mapped_column(BigInteger)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    holder: Mapped[str | None] = mapped_column(String)
    woken: Mapped[bool] = mapped_column(Boolean, server_default=text("false"), nullable=False)

    __table_args__ = (
        Index("unfinished_due_idx", "workflow", "workflow_version", "queue",
              text("priority DESC"), "run_at", "job_id",
              postgresql_where=text("due AND lease_token IS NULL")),
        Index("unfinished_scheduled_idx", "workflow", "workflow_version", "run_at",
              postgresql_where=text("NOT due AND run_at IS NOT NULL AND lease_token IS NULL")),
        Index("unfinished_timeout_idx", "timing_out_at",
              postgresql_where=text("timing_out_at IS NOT NULL AND lease_token IS NULL")),
        Index("unfinished_leased_idx", "worker_id", "lease_expires_at",
              postgresql_where=text("lease_token IS NOT NULL")),
        Index("unfinished_unique_key_idx", "unique_key", unique=True,
              postgresql_where=text("unique_key IS NOT NULL")),
        CheckConstraint("NOT due OR run_at IS NOT NULL", name="unfinished_due_has_time"),
        CheckConstraint("(lease_token IS NULL) = (lease_expires_at IS NULL)",
                        name="unfinished_lease"),
        {"schema": SCHEMA},
    )


class EventKey(Base):
    """The lock of the event keys of one bucket (by the key's hash), taken by their emits and
    waits."""

    __tablename__ = "event_keys"

    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    changes: Mapped[int] = mapped_column(BigInteger, server_default="0", nullable=False)

    __table_args__ = (
        CheckConstraint("bucket BETWEEN 0 AND 4095", name="event_keys_bucket"),
        {"schema": SCHEMA},
    )


class Wakeup(Base):
    """A job that reached its end whose family is still to be told (its parent woken, its
    descendants ended): another transaction held one of their rows."""

    __tablename__ = "wakeups"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    failed: Mapped[bool] = mapped_column(Boolean, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = ({"schema": SCHEMA},)


class Waiting(Base):
    """Retired: pj0008's table of waiting jobs, kept empty while workers of that release may
    run (their writes to it are refused)."""

    __tablename__ = "waiting"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    status: Mapped[Status] = mapped_column(status_type, nullable=False)
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
        CheckConstraint("status IN ('ready', 'err', 'sleep')", name="waiting_status"),
        CheckConstraint("NOT due OR run_at IS NOT NULL", name="waiting_due_has_time"),
        {"schema": SCHEMA},
    )


class Lease(Base):
    """Retired: pj0008's table of leases, kept empty while workers of that release may run."""

    __tablename__ = "leases"

    token: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    worker_id: Mapped[int | None] = mapped_column(BigInteger)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    job_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), nullable=False)

    __table_args__ = ({"schema": SCHEMA},)


class QueueSlot(Base):
    """One of a limited queue's places: taken by a job while it runs (``job_id``)."""

    __tablename__ = "queue_slots"

    queue: Mapped[str] = mapped_column(String, primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index("queue_slots_job_idx", "job_id", postgresql_where=text("job_id IS NOT NULL")),
        {"schema": SCHEMA},
    )


class QueueStart(Base):
    """One of a rate-limited queue's starts: free again once ``started_at`` is a period old."""

    __tablename__ = "queue_starts"

    queue: Mapped[str] = mapped_column(String, primary_key=True)
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


class HistorySettingsRecord(Base):
    """How history is kept (``JobQueue.set_history``): the one row of
    ``postjob.history_settings``, or none for the defaults."""

    __tablename__ = "history_settings"

    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    #: how long a finished job is kept after it settled; None: for ever
    keep: Mapped[timedelta | None] = mapped_column(Interval)
    #: job ids per range of the record
    partition_size: Mapped[int] = mapped_column(BigInteger, server_default="1000000",
                                                nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = (
        CheckConstraint("id", name="history_settings_one_row"),
        CheckConstraint("keep IS NULL OR keep > interval '0'",
                        name="history_settings_keep_positive"),
        CheckConstraint("partition_size >= 1000", name="history_settings_partition_size"),
        {"schema": SCHEMA},
    )


class HistoryRangeCheck(Base):
    """What the rotation read of one range of the record: ``postjob.history_partitions``."""

    __tablename__ = "history_partitions"

    name: Mapped[str] = mapped_column(String, primary_key=True)
    newest_settle: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    checked_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = ({"schema": SCHEMA},)


class SettledCount(Base):
    """Jobs settled in one minute, of one queue and status, by one backend (``shard``: its
    pid; 0 once the upkeep folded a closed minute): a row of ``postjob.settled_counts``, what
    the dashboard's last hour reads."""

    __tablename__ = "settled_counts"

    minute: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    queue: Mapped[str] = mapped_column(String, primary_key=True)
    status: Mapped[Status] = mapped_column(status_type, primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(BigInteger, nullable=False)

    __table_args__ = ({"schema": SCHEMA},)
