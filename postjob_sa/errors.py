"""The exceptions of postjob_sa."""

from __future__ import annotations

from typing import Any


class PostjobError(Exception):
    """Base class of the errors postjob_sa raises."""


class InvalidArgument(PostjobError, ValueError):
    """An argument was rejected before anything was written."""


class JobNotFound(PostjobError, LookupError):
    """No job (or token) matches."""


class InvalidJobState(PostjobError):
    """The job is not in a state that allows the operation."""


class SchemaError(PostjobError):
    """The postjob schema is missing, at a revision that does not fit, or managed by your app's
    Alembic migrations where ``postjob db migrate`` was asked to; the message says what to run."""


class NotInJob(PostjobError, RuntimeError):
    """A workflow helper was called outside a running job."""


#: The SQLSTATE postjob's functions raise for a write by a run that no longer holds its job.
LEASE_LOST_STATE = "PJ001"


class LeaseLost(BaseException):
    """The running job is no longer this run's: it was reaped, reset or resolved meanwhile.

    Raised by ``spawn``/``result``/``set_workflow_status`` so that the abandoned run stops
    writing; a BaseException, so that ``except Exception`` in workflow code does not swallow it.
    The worker logs it and records nothing for the run.
    """

    def __init__(self, job_id: int):
        super().__init__(f"job {job_id} lost its lease: its run is abandoned")
        self.job_id = job_id


class JobCancelled(PostjobError):
    """The running job was cancelled (``JobQueue.cancel``, ``postjob job cancel``).

    Raised in the workflow by its next ``spawn``, ``result``, ``set_workflow_status`` or after
    its worker's heartbeat learnt it. An Exception: a workflow may catch it to clean up. The
    job is ``cancelled`` already; whatever the run does next is not recorded.
    """

    def __init__(self, job_id: int):
        super().__init__(f"job {job_id} was cancelled")
        self.job_id = job_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (JobCancelled, (self.job_id,))


class NonRecoverable(Exception):
    """Raise from a workflow to fail its job at once, without retries."""


class ArgumentMismatch(NonRecoverable):
    """A job's args do not fit its workflow's function (the job was enqueued where the
    function was not known, e.g. by name from another process): its first run fails it,
    since no retry can make them fit."""


class ResultNotJSON(NonRecoverable):
    """A workflow returned a value that cannot be stored as JSON."""


class ChildFailed(NonRecoverable):
    """A child job the workflow waits for failed or timed out.

    Non-recoverable: unless the workflow catches it, the parent fails at once (retrying it
    would meet the same failed child again).
    """

    def __init__(self, child_id: int, status: str, error: str | None, message: str | None):
        self.child_id = child_id
        self.status = status
        self.error = error
        self.message = message
        super().__init__(f"child job {child_id} {status}: {error or ''}: {message or ''}".rstrip(": "))

    def __reduce__(self) -> tuple[Any, ...]:
        return (ChildFailed, (self.child_id, self.status, self.error, self.message))


class EventTimeout(NonRecoverable):
    """``wait_for_event(key, timeout)`` saw no event under ``key`` in time.

    Catch it to go another way; re-runs of the job raise it again at the same wait (it is
    stored). Non-recoverable: unless caught, the job fails at once (a retry would meet the
    same stored timeout).
    """

    def __init__(self, key: str, timeout: float | None = None):
        self.key = key
        self.timeout = timeout
        waited = f" in {timeout:g} s" if timeout is not None else " in time"
        super().__init__(f"no event under {key!r} came{waited}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (EventTimeout, (self.key, self.timeout))


class DuplicateStep(NonRecoverable):
    """A step name was used twice in one run (each ``step`` of a run needs a name of its own)."""
