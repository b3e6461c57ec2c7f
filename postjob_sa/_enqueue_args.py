"""The arguments of an enqueue, checked: the workflow named, the job's options with the
workflow's defaults, and the refusal of a keyword (a workflow's arguments are positional).

``JobQueue.enqueue`` and ``enqueue_many`` (and ``AsyncJobQueue``'s, which run them) use these
before anything is written; ``Workflow.spawn`` refuses keywords the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from postjob_sa import _validate
from postjob_sa.errors import InvalidArgument
from postjob_sa.models import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, MANUAL_WORKFLOW
from postjob_sa.registry import Workflow


def workflow_name(workflow: Workflow[Any, Any] | str) -> tuple[str, Workflow[Any, Any] | None]:
    """The workflow's name, and the workflow when given one (not only its name)."""
    if isinstance(workflow, Workflow):
        return workflow.name, workflow
    if callable(workflow):
        raise InvalidArgument(
            f"{getattr(workflow, '__qualname__', workflow)!r} is not a workflow: decorate it with "
            "@postjob_sa.workflow (or pass the workflow's name)"
        )
    name = _validate.name(workflow, "workflow")
    if name == MANUAL_WORKFLOW:
        raise InvalidArgument(
            f"{MANUAL_WORKFLOW} is reserved for manual steps, which no worker runs: create one "
            "with postjob_sa.manual(...) inside a workflow"
        )
    return name, None


def job_options(
    wf: Workflow[Any, Any] | None,
    queue: str | None,
    max_attempts: int | None,
    timeout: float | None,
    version: str | None,
    tags: Mapping[str, Any] | None,
    run_at: datetime | None,
) -> dict[str, Any]:
    """The options of a job, checked, with the workflow's defaults where none is given."""
    return {
        "queue": _validate.name(queue, "queue") if queue is not None
        else (wf.queue if wf and wf.queue else DEFAULT_QUEUE),
        "max_attempts": _validate.max_attempts(max_attempts)
        or (wf.max_attempts if wf and wf.max_attempts else DEFAULT_MAX_ATTEMPTS),
        "timeout": _validate.seconds(timeout, "timeout")
        if timeout is not None else (wf.timeout if wf else None),
        "workflow_version": "" if version is None else _validate.name(version, "version"),
        "tags": _validate.tags_json(tags),
        "run_at": _validate.run_at(run_at),
    }
