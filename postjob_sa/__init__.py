"""postjob_sa: a PostgreSQL job queue and restartable workflow engine for SQLAlchemy.

Jobs live in the ``postjob`` schema, installed by a revision of your own Alembic history
(:mod:`postjob_sa.migrations`) or as the Alembic branch ``postjob``; ``JobQueue(session)``
enqueues and checks out inside the application's own transaction; workflows spawn child
jobs and wait for them, re-running from the top when a child finishes.

Each public name is imported from its module the first time it is used (``import postjob_sa``
itself imports nothing heavy): ``postjob --help`` and a worker that never migrates do not pay
for Alembic, the ORM models or the worker when they do not use them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from postjob_sa import migrations
    from postjob_sa._history import HistoryRange, HistorySettings, RotationReport
    from postjob_sa._migrations import (
        VERSION_LOCATION,
        downgrade,
        include_object,
        include_postjob_schema,
        migrate,
    )
    from postjob_sa.async_queue import AsyncJobQueue
    from postjob_sa.children import ChildHandle
    from postjob_sa.context import (
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
    from postjob_sa.worker.options import WorkerOptions

#: Where each public name is defined.
_HOMES = {
    "VERSION_LOCATION": "_migrations", "downgrade": "_migrations",
    "include_object": "_migrations", "include_postjob_schema": "_migrations",
    "migrate": "_migrations",
    "AsyncJobQueue": "async_queue",
    "HistoryRange": "_history", "HistorySettings": "_history", "RotationReport": "_history",
    "ChildHandle": "children", "RunningJob": "context", "current_job": "context",
    "current_session": "context", "manual": "context", "set_workflow_status": "context",
    "set_workflow_status_async": "context",
    "sleep": "durable", "sleep_async": "durable", "sleep_until": "durable",
    "sleep_until_async": "durable", "step": "durable", "step_async": "durable",
    "wait_for_event": "durable", "wait_for_event_async": "durable",
    "ChildFailed": "errors", "EventTimeout": "errors", "InvalidArgument": "errors", "InvalidJobState": "errors",
    "JobCancelled": "errors", "JobNotFound": "errors", "NonRecoverable": "errors",
    "NotInJob": "errors", "PostjobError": "errors", "ResultNotJSON": "errors",
    "SchemaError": "errors",
    "Base": "models", "Job": "models", "QueueLimit": "models", "Schedule": "models",
    "Status": "models", "Token": "models", "metadata": "models",
    "JobQueue": "queue",
    "Registry": "registry", "Workflow": "registry", "workflow": "registry",
    "WorkerOptions": "worker.options",
}


#: The package's public modules: ``postjob_sa.<module>`` imports one on first use, as it did
#: when the package imported them all (host revisions use ``postjob_sa.migrations``).
_MODULES = frozenset({"async_queue", "context", "durable", "errors", "metrics", "migrations",
                      "models", "queue", "registry", "testing", "web"})


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"postjob_sa.{name}")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'postjob_sa' has no attribute {name!r}")
    if home == "models":  # the schema is whole: the durable tables' models join metadata
        importlib.import_module("postjob_sa.durable.models")
    value = getattr(importlib.import_module(f"postjob_sa.{home}"), name)
    globals()[name] = value  # found once, then a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "VERSION_LOCATION",
    "AsyncJobQueue",
    "Base",
    "ChildFailed",
    "ChildHandle",
    "EventTimeout",
    "HistoryRange",
    "HistorySettings",
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
    "RotationReport",
    "RunningJob",
    "Schedule",
    "SchemaError",
    "Status",
    "Token",
    "WorkerOptions",
    "Workflow",
    "current_job",
    "current_session",
    "downgrade",
    "include_object",
    "include_postjob_schema",
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
