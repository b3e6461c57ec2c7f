"""A transactional job's conflicts with other transactions: a serialization failure (SQLSTATE
40001) or a deadlock (40P01) that its transaction met, in the run or in recording its outcome.

Its checkout, its writes and its outcome are one transaction, so the worker rolls the whole of
it back (the job is due again, as before its checkout, no attempt counted) and runs the job
again at once in a new transaction, whose snapshot sees what the conflict was about. Only the
:data:`MAX_CONFLICTS`-th conflict in a row counts an attempt: the next checkout of the job
records it, with the conflicts' error, without running the job once more.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from postjob_sa import _backoff, _json, _metrics
from postjob_sa.context import RunningJob
from postjob_sa.registry import Workflow
from postjob_sa.worker.executor import CONFLICTS, MAX_MESSAGE_CHARS, Outcome

log = logging.getLogger("postjob_sa.worker")

#: Conflicts in a row after which a transactional job's attempt fails (with the last one's error).
MAX_CONFLICTS = 5
#: Jobs whose conflicts a worker keeps count of at most (a job another worker went on with
#: leaves its count behind).
_KEPT_COUNTS = 1000


class Conflict(Exception):
    """A transactional job's transaction met a conflict: roll it back, run the job again."""

    def __init__(self, job: RunningJob, outcome: Outcome):
        super().__init__(outcome.message)
        self.job = job
        self.outcome = outcome


@dataclass(slots=True)
class _Count:
    attempt: int
    conflicts: int
    last: Outcome


class Conflicts:
    """The conflicts in a row of the jobs a transactional worker runs (see the module docstring)."""

    def __init__(self) -> None:
        self._counts: dict[int, _Count] = {}

    def met(self, conflict: Conflict) -> None:
        """Count a conflict whose transaction was rolled back, and say so (at INFO)."""
        job, outcome = conflict.job, conflict.outcome
        count = self._counts.get(job.id)
        if count is None or count.attempt != job.attempt:
            if len(self._counts) >= _KEPT_COUNTS:
                self._counts.clear()
            count = self._counts[job.id] = _Count(job.attempt, 0, outcome)
        count.conflicts += 1
        count.last = outcome
        _metrics.finished(job.workflow, "release", 0.0)  # back to due, as a released job
        state = outcome.conflict or ""
        log.info("%s: its transaction met a %s (SQLSTATE %s) and was rolled back; running it "
                 "again at once in a new transaction (conflict %d in a row of %d, no attempt "
                 "counted): %s", outcome.describe(), CONFLICTS.get(state, "conflict"), state,
                 count.conflicts, MAX_CONFLICTS, outcome.message)

    def failed(self, job: RunningJob, wf: Workflow[Any, Any], fast_mode: bool) -> Outcome | None:
        """The failed attempt (kind ``err``) of a job checked out again after
        :data:`MAX_CONFLICTS` conflicts in a row; None: run it."""
        count = self._counts.get(job.id)
        if count is None or count.attempt != job.attempt or count.conflicts < MAX_CONFLICTS:
            return None
        last = count.last
        message = (f"its transaction met {count.conflicts} conflicts in a row (serialization "
                   f"failures or deadlocks), each rolled back and run again at once; the last: "
                   f"{last.message}")
        return Outcome(job.id, job.lease_token, "err", error=last.error,
                       message=_json.storable(message, MAX_MESSAGE_CHARS),
                       backtrace=last.backtrace, version=wf.version, workflow=job.workflow,
                       attempt=job.attempt, max_attempts=job.max_attempts,
                       retry_in=_backoff.delay(wf.backoff, job.attempt, fast=fast_mode,
                                               workflow=wf.name))

    def ended(self, job_id: int) -> None:
        """The job's outcome is recorded: its conflicts in a row are over."""
        self._counts.pop(job_id, None)
