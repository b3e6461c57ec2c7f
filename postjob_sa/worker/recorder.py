"""Outcomes waiting to be recorded, and recording them.

Outcomes are recorded in batches: one ``postjob.finish_v4`` call, in the same statement as the
next checkout when the worker loop records them (``_sql.WORKER_CYCLE``), sends them as typed
arrays and gets back only what did not go as sent (a run that had lost its job; a sleep whose
child had ended). The rows cross into Python here, by name: the jobs checked out as
:class:`~postjob_sa.context.RunningJob`, the others as sets of ids. What each
recorded outcome did follows from the outcome itself and the attempt it was, so nothing is read
back per job. A batch must never be lost to one bad outcome: when the database refuses a value
(or a deadlock persists), the outcomes are recorded one at a time and the job whose outcome is
refused fails with the reason, while the others are recorded as they are.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from typing import Any, NamedTuple

from postjob_sa import _metrics, _sql
from postjob_sa._db import Conn, Failure, failure
from postjob_sa.context import RunningJob
from postjob_sa.worker.executor import Outcome, outcome_params
from postjob_sa.worker.held import HeldJobs

log = logging.getLogger("postjob_sa.worker")

#: How often a deadlock or serialization conflict is tried again before it counts as an error.
TRANSIENT_RETRIES = 3
_NOTHING = outcome_params([])


class CycleRow(NamedTuple):
    """A row of the worker's cycle (_sql.WORKER_CYCLE, _sql.WORKER_FINISH): a job checked out
    (kind 'job', with RunningJob's columns), or an outcome not recorded as sent ('lost',
    'woken': only the id)."""

    kind: str
    id: int
    lease_token: int | None = None
    workflow: str | None = None
    workflow_version: str | None = None
    args: Any = None
    queue: str | None = None
    root_id: int | None = None
    full_id: str | None = None
    parent_id: int | None = None
    attempt: int | None = None
    max_attempts: int | None = None

    def job(self) -> RunningJob:
        return RunningJob(self.id, self.lease_token, self.workflow or "",
                          self.workflow_version or "", self.args, self.queue or "",
                          self.root_id or self.id, self.full_id or str(self.id), self.parent_id,
                          self.attempt or 1, self.max_attempts or 1)


class Recorder:
    """A thread-safe buffer of outcomes, and the code that records them."""

    def __init__(self, *, lease: float, held: HeldJobs | None = None):
        self.lease = lease
        #: the jobs the worker holds: recording an outcome releases its job
        self.held = held if held is not None else HeldJobs()
        self._lock = threading.Lock()
        self._buffer: list[Outcome] = []
        self._oldest: float | None = None
        #: runs whose outcome was recorded (releases not counted)
        self.recorded = 0
        #: the id of the last job whose outcome was recorded
        self.last_recorded: int | None = None

    # -- the buffer ----------------------------------------------------------------------------

    def add(self, outcome: Outcome) -> bool:
        """Buffer an outcome; True when it is the first one waiting (the keeper's flusher need
        only hear of that one)."""
        with self._lock:
            first = not self._buffer
            if first:
                self._oldest = time.monotonic()
            self._buffer.append(outcome)
            return first

    def take(self) -> list[Outcome]:
        with self._lock:
            taken, self._buffer, self._oldest = self._buffer, [], None
            return taken

    def put_back(self, outcomes: list[Outcome]) -> None:
        """Outcomes that could not be recorded (connection lost): the next cycle tries again."""
        if outcomes:
            with self._lock:
                self._buffer[:0] = outcomes
                self._oldest = time.monotonic() if self._oldest is None else self._oldest

    def age(self) -> float | None:
        """Seconds since the oldest waiting outcome was added; None when none waits."""
        with self._lock:
            return None if self._oldest is None else time.monotonic() - self._oldest

    # -- recording -----------------------------------------------------------------------------

    def cycle(self, conn: Conn, outcomes: list[Outcome], checkout: dict[str, Any] | None,
              worker_id: int | None) -> list[RunningJob]:
        """Record ``outcomes`` and the runs that stopped without one and, with ``checkout``
        parameters, check out the next jobs: one round trip. Returns the jobs checked out. On
        a connection failure the outcomes go back to the buffer and the error propagates."""
        base = {"worker_id": worker_id, "lease": self.lease}
        stopped = self.held.take_stopped()
        if checkout is None:
            statement, params = _sql.WORKER_FINISH, {**base, **outcome_params(outcomes, stopped)}
        elif outcomes or stopped:
            statement = _sql.WORKER_CYCLE
            params = {**base, **outcome_params(outcomes, stopped), **checkout}
        else:  # nothing to record: the checkout alone (one plpgsql call, fewer parameters)
            statement, params = _sql.WORKER_CHECKOUT, {**base, **checkout}
        try:
            try:
                rows = self._call(conn, statement, params)
            except Exception as exc:
                if not outcomes or failure(exc) not in (Failure.DATA, Failure.TRANSIENT):
                    raise
                # one outcome the database refuses must not cost the others: one at a time
                log.warning("recording %d outcomes failed (%s): recording them one by one",
                            len(outcomes), _one_line(exc))
                self._done(conn, outcomes, self._one_by_one(conn, outcomes, base))
                outcomes = []
                rows = self._call(conn, statement, {**params, **_NOTHING})
        except BaseException:
            self.put_back(outcomes)
            self.held.put_back_stopped(stopped)
            raise
        self._done(conn, outcomes, rows)
        return [r.job() for r in rows if r.kind == "job"]

    def _call(self, conn: Conn, statement: str, params: dict[str, Any]) -> list[CycleRow]:
        for attempt in range(TRANSIENT_RETRIES + 1):
            try:
                return [CycleRow(*r) for r in conn.prepared_tuples(statement, params)]
            except Exception as exc:
                if failure(exc) is not Failure.TRANSIENT or attempt == TRANSIENT_RETRIES:
                    raise
                log.warning("%s: trying again", _one_line(exc))
                time.sleep(random.uniform(0.02, 0.1) * (attempt + 1))
        raise AssertionError("unreachable")

    def _one_by_one(self, conn: Conn, outcomes: list[Outcome],
                    base: dict[str, Any]) -> list[CycleRow]:
        done: list[CycleRow] = []
        for outcome in outcomes:
            one = base
            try:
                rows = self._call(conn, _sql.WORKER_FINISH, {**one, **outcome_params([outcome])})
            except Exception as exc:
                if failure(exc) not in (Failure.DATA, Failure.TRANSIENT):
                    raise
                reason = _one_line(exc)
                log.error("job %s: the database refused its outcome (%s): the job fails",
                          outcome.job_id, reason, extra=job_fields(outcome))
                rows = self._call(conn, _sql.WORKER_FINISH,
                                  {**one, **outcome_params([outcome.rejected(reason)])})
                outcome.kind, outcome.error, outcome.message = "failed", "OutcomeRefused", reason
            done.extend(rows)
        return done

    def _done(self, conn: Conn, outcomes: list[Outcome], rows: list[CycleRow]) -> None:
        """Release, count and log what was recorded (everything sent, but the runs the rows
        call lost)."""
        if not outcomes:
            return
        self.held.release([o.job_id for o in outcomes])
        lost: set[int] = set()
        woken: set[int] = set()
        for row in rows:
            if row.kind == "lost":
                lost.add(row.id)
            elif row.kind == "woken":
                woken.add(row.id)
        finished: Counter[tuple[str, str]] = Counter()
        info = log.isEnabledFor(logging.INFO)
        reasons = _why_lost(conn, lost) if lost else {}
        for outcome in outcomes:
            if outcome.job_id in lost:
                log.warning("%s: %s: its %s outcome was not recorded", outcome.describe(),
                            reasons.get(outcome.job_id, _LOST), outcome.kind,
                            extra=job_fields(outcome))
                _metrics.lease_lost(outcome.workflow)
                continue
            if outcome.kind != "release":
                self.recorded += 1
                self.last_recorded = outcome.job_id
            finished[outcome.workflow, outcome.kind] += 1
            if outcome.kind != "release":
                _metrics.duration(outcome.workflow, outcome.duration)
            if info or outcome.kind not in _QUIET:
                log_outcome(outcome, recorded_status(outcome, outcome.job_id in woken))
        _metrics.finished_many(finished)


#: Outcomes logged only at INFO (the others are warnings).
_QUIET = frozenset({"ok", "sleep"})
_LOST = "lease lost (reaped, reset or resolved meanwhile)"


def _why_lost(conn: Conn, ids: set[int]) -> dict[int, str]:
    """Why these runs lost their jobs, as a log line says it (cancelled ones by name)."""
    try:
        rows = conn.tuples(_sql.JOBS_STATUS_NOW, {"ids": sorted(ids)})
    except Exception:  # the log line says less, nothing else depends on it
        return {}
    return {int(job_id): "cancelled while it ran" if status == "cancelled" else _LOST
            for job_id, status in rows}


def _ints(values: list[int]) -> str:
    """A bigint[] literal."""
    return "{" + ",".join(map(str, values)) + "}"


def recorded_status(outcome: Outcome, woken: bool = False) -> str:
    """The status a recorded outcome left its job in."""
    if outcome.kind == "err":
        return "failed" if outcome.final_failure else "err"
    if outcome.kind == "sleep":
        return "ready" if woken else "sleep"
    if outcome.kind == "release":
        return "ready"
    return outcome.kind


#: What a failed run's recorded status means, by (outcome, status recorded).
_FAILURE_NOTES = {
    ("err", "err"): "will retry",
    ("err", "failed"): "no attempts left",
    ("failed", "failed"): "not retried",
}


def job_fields(outcome: Outcome, attempt: int | None = None,
               status: str | None = None) -> dict[str, Any]:
    """The structured fields of a job's log line (``extra=``; see docs/operations.md)."""
    return {"job_id": outcome.job_id, "workflow": outcome.workflow,
            "attempt": outcome.attempt if attempt is None else attempt,
            "duration": round(outcome.duration, 6), "outcome": outcome.kind, "status": status}


def log_outcome(outcome: Outcome, status: str, attempt: int | None = None) -> None:
    """Write a recorded outcome's line: at INFO when it went well, at WARNING with the error
    class and message (and the status the database recorded) when it failed; the traceback at
    INFO. Each line carries the fields of :func:`job_fields`."""
    took = f"{outcome.duration * 1000:.1f} ms"
    extra = job_fields(outcome, attempt, status)
    if outcome.kind in ("err", "failed"):
        note = _FAILURE_NOTES.get((outcome.kind, status))
        if status == "err" and outcome.retry_in is not None:
            note = f"will retry in {outcome.retry_in:g} s"
        log.warning("%s: %s in %s%s: %s: %s", outcome.describe(), status, took,
                    f" ({note})" if note else "", outcome.error, outcome.message, extra=extra)
        if outcome.backtrace and log.isEnabledFor(logging.INFO):
            frames = json.loads(outcome.backtrace)
            log.info("%s: traceback (most recent call last):\n  %s", outcome.describe(),
                     "\n  ".join(frames), extra=extra)
    elif outcome.kind == "sleep":
        if log.isEnabledFor(logging.INFO):
            log.info("%s: %s in %s (%s)", outcome.describe(),
                     "sleeping" if status == "sleep" else "woken at once", took, _waits(outcome),
                     extra=extra)
    elif outcome.kind == "release":
        log.warning("%s: released for another run (no attempt counted)", outcome.describe(),
                    extra=extra)
    elif log.isEnabledFor(logging.INFO):
        log.info("%s: %s in %s", outcome.describe(), status, took, extra=extra)


def _waits(outcome: Outcome) -> str:
    """What a sleeping job waits for, for its log line."""
    if outcome.awaiting is not None:
        return f"waits for job {outcome.awaiting}"
    if outcome.wake_in is not None:
        return f"runs again in {outcome.wake_in:.3g} s"
    return "waits to be woken"


def _one_line(exc: BaseException) -> str:
    """The database's own message (without its context lines), or the error's text."""
    diag = getattr(getattr(exc, "orig", exc), "diag", None)
    text = getattr(diag, "message_primary", None) or str(exc)
    return " ".join(text.split())[:300] or type(exc).__name__
