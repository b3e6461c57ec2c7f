"""The base of the ``postjob`` schema's models: its metadata, the declarative base, and the
statuses (postjob_sa.models has the models; it re-exports these)."""

from __future__ import annotations

import enum

from sqlalchemy import Enum, MetaData
from sqlalchemy.orm import DeclarativeBase

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
#: The final statuses whose jobs all carry an error (postjobs_errors_idx holds them): a list of
#: only these is read through that index.
ERRORED_STATUSES = frozenset({Status.failed, Status.timeout, Status.cancelled})


def errored_only(statuses: list[str] | None) -> bool:
    """Whether every status asked for is one whose jobs carry an error."""
    return bool(statuses) and {str(s) for s in statuses or ()} <= {s.value for s in ERRORED_STATUSES}


#: What a job waits as in its row of postjob.unfinished (a running job keeps the one it was
#: taken in; a job ended from outside while it ran has its final status there).
WAITING_STATUSES = frozenset({Status.ready, Status.err, Status.sleep})

#: The tables of the ``postjob`` schema (``Base.metadata``), for a host's Alembic env.py.
metadata = MetaData(schema=SCHEMA)


class Base(DeclarativeBase):
    """Declarative base of the ``postjob`` schema (keep it apart from the host's own base)."""

    metadata = metadata


status_type = Enum(
    Status,
    name="statuses",
    schema=SCHEMA,
    values_callable=lambda e: [m.value for m in e],
    create_type=False,
)
