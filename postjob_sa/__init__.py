"""postjob_sa: a PostgreSQL job queue and restartable workflow engine for SQLAlchemy.

Jobs live in the ``postjob`` schema, installed by a revision of your own Alembic history
(:mod:`postjob_sa.migrations`) or as the Alembic branch ``postjob``; ``JobQueue(session)``
enqueues and checks out inside the application's own transaction; workflows spawn child
jobs and wait for them, re-running from the top when a child finishes.
"""

from __future__ import annotations

from postjob_sa import (
    _alembic_quiet,  # noqa: F401  (first: it imports alembic quietly)
    migrations,
)
from postjob_sa._migrations import VERSION_LOCATION, downgrade, include_object, migrate
from postjob_sa.async_queue import AsyncJobQueue
from postjob_sa.context import (
    ChildHandle,
    RunningJob,
    current_job,
    current_session,
    manual,
    set_workflow_status,
    set_workflow_status_async,
)
from postjob_sa.durable import (
    sleep,
    sleep_async,
    sleep_until,
    sleep_until_async,
    step,
    step_async,
    wait_for_event,
    wait_for_event_async,
)
from postjob_sa.errors import (
    ChildFailed,
    EventTimeout,
    InvalidArgument,
    InvalidJobState,
    JobCancelled,
    JobNotFound,
    NonRecoverable,
    NotInJob,
    PostjobError,
    ResultNotJSON,
    SchemaError,
)
from postjob_sa.models import Base, Job, QueueLimit, Schedule, Status, Token, metadata
from postjob_sa.queue import JobQueue
from postjob_sa.registry import Registry, Workflow, workflow

__all__ = [
    "VERSION_LOCATION",
    "AsyncJobQueue",
    "Base",
    "ChildFailed",
    "ChildHandle",
    "EventTimeout",
    "InvalidArgument",
    "InvalidJobState",
    "Job",
    "JobCancelled",
    "JobNotFound",
    "JobQueue",
    "NonRecoverable",
    "NotInJob",
    "PostjobError",
    "QueueLimit",
    "Registry",
    "ResultNotJSON",
    "RunningJob",
    "Schedule",
    "SchemaError",
    "Status",
    "Token",
    "Workflow",
    "current_job",
    "current_session",
    "downgrade",
    "include_object",
    "manual",
    "metadata",
    "migrate",
    "migrations",
    "set_workflow_status",
    "set_workflow_status_async",
    "sleep",
    "sleep_async",
    "sleep_until",
    "sleep_until_async",
    "step",
    "step_async",
    "wait_for_event",
    "wait_for_event_async",
    "workflow",
]
