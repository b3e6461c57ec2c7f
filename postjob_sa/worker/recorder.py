"""Outcomes waiting to be recorded, and recording them.

Outcomes are recorded in batches (one ``worker_cycle`` call, together with the next checkout when
the worker loop records them). A batch must never be lost to one bad outcome: when the database
refuses a value (or a deadlock persists), the outcomes are recorded one at a time and the job
whose outcome is refused fails with the reason, while the others are recorded as they are.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import Any

from postjob_sa import _metrics, _sql
from postjob_sa._db import Conn, Failure, failure
from postjob_sa.worker.executor import Outcome, finish_params

log = logging.getLogger("postjob_sa.worker")

#: How often a deadlock or serialization conflict is tried again before it counts as an error.
TRANSIENT_RETRIES = 3
_NO_CHECKOUT: dict[str, Any] = {
    "workflows": [], "workflow_versions": [], "queues": None, "limit": 0, "reap": False,
}


class Recorder:
    """A thread-safe buffer of outcomes, and the code that records them."""

    def __init__(self, *, fast_mode: bool, lease: float):
        self.fast_mode = fast_mode
        self.lease = lease
        self._lock = threading.Lock()
        self._buffer: list[Outcome] = []
        self._oldest: float | None = None
        #: runs whose outcome was recorded (releases not counted)
        self.recorded = 0
        #: the id of the last job whose outcome was recorded
        self.last_recorded: int | None = None

    # -- the buffer ----------------------------------------------------------------------------

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            if not self._buffer:
                self._oldest = time.monotonic()
            self._buffer.append(outcome)

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
              worker_id: int | None, identifier: str) -> list[dict[str, Any]]:
        """Record ``outcomes`` and, with ``checkout`` parameters, check out the next jobs: one
        round trip. Returns the rows of the jobs checked out. On a connection failure the
        outcomes go back to the buffer and the error propagates."""
        base = {"worker_id": worker_id, "identifier": identifier, "lease": self.lease,
                "fast": self.fast_mode}
        params = {**base, **finish_params(outcomes, self.fast_mode), **(checkout or _NO_CHECKOUT)}
        try:
            try:
                rows = self._call(conn, params)
            except Exception as exc:
                if not outcomes or failure(exc) not in (Failure.DATA, Failure.TRANSIENT):
                    raise
                # one outcome the database refuses must not cost the others: one at a time
                log.warning("recording %d outcomes failed (%s): recording them one by one",
                            len(outcomes), _one_line(exc))
                self._done(outcomes, self._one_by_one(conn, outcomes, base))
                outcomes = []
                if checkout is None:
                    return []
                rows = self._call(conn, {**base, **finish_params([], self.fast_mode), **checkout})
        except BaseException:
            self.put_back(outcomes)
            raise
        self._done(outcomes, rows)
        return [r for r in rows if r["kind"] == "job"]

    def _call(self, conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
        for attempt in range(TRANSIENT_RETRIES + 1):
            try:
                return conn.rows(_sql.WORKER_CYCLE, params)
            except Exception as exc:
                if failure(exc) is not Failure.TRANSIENT or attempt == TRANSIENT_RETRIES:
                    raise
                log.warning("%s: trying again", _one_line(exc))
                time.sleep(random.uniform(0.02, 0.1) * (attempt + 1))
        raise AssertionError("unreachable")

    def _one_by_one(self, conn: Conn, outcomes: list[Outcome],
                    base: dict[str, Any]) -> list[dict[str, Any]]:
        done: list[dict[str, Any]] = []
        for outcome in outcomes:
            try:
                rows = self._call(conn, {**base, **finish_params([outcome], self.fast_mode),
                                         **_NO_CHECKOUT})
            except Exception as exc:
                if failure(exc) not in (Failure.DATA, Failure.TRANSIENT):
                    raise
                reason = _one_line(exc)
                log.error("job %s: the database refused its outcome (%s): the job fails",
                          outcome.job_id, reason, extra=job_fields(outcome))
                rows = self._call(conn, {**base, **finish_params([outcome.rejected(reason)],
                                                                 self.fast_mode), **_NO_CHECKOUT})
                outcome.kind, outcome.error, outcome.message = "failed", "OutcomeRefused", reason
            done.extend(rows)
        return done

    def _done(self, outcomes: list[Outcome], rows: list[dict[str, Any]]) -> None:
        """Count and log what the database recorded for each outcome."""
        done = {r["id"]: r for r in rows if r["kind"] == "done"}
        for outcome in outcomes:
            row = done.get(outcome.job_id)
            if row is None:
                log.warning("%s: lease lost (reaped, reset or resolved meanwhile): its %s "
                            "outcome was not recorded", outcome.describe(), outcome.kind,
                            extra=job_fields(outcome))
                _metrics.lease_lost(outcome.workflow)
                continue
            if outcome.kind != "release":
                self.recorded += 1
                self.last_recorded = outcome.job_id
            log_outcome(outcome, row["status"], row.get("attempt"))


#: What a failed run's recorded status means, by (outcome, status recorded).
_FAILURE_NOTES = {
    ("err", "err"): "will retry",
    ("err", "failed"): "no attempts left",
    ("failed", "failed"): "not retried",
}


def job_fields(outcome: Outcome, attempt: int | None = None,
               status: str | None = None) -> dict[str, Any]:
    """The structured fields of a job's log line (``extra=``; see docs/operations.md)."""
    return {"job_id": outcome.job_id, "workflow": outcome.workflow, "attempt": attempt,
            "duration": round(outcome.duration, 6), "outcome": outcome.kind, "status": status}


def log_outcome(outcome: Outcome, status: str, attempt: int | None = None) -> None:
    """Count a recorded outcome and write its line: at INFO when it went well, at WARNING with
    the error class and message (and the status the database recorded) when it failed; the
    traceback at INFO. Each line carries the fields of :func:`job_fields`."""
    _metrics.finished(outcome.workflow, outcome.kind, outcome.duration)
    took = f"{outcome.duration * 1000:.1f} ms"
    extra = job_fields(outcome, attempt, status)
    if outcome.kind in ("err", "failed"):
        note = _FAILURE_NOTES.get((outcome.kind, status))
        log.warning("%s: %s in %s%s: %s: %s", outcome.describe(), status, took,
                    f" ({note})" if note else "", outcome.error, outcome.message, extra=extra)
        if outcome.backtrace and log.isEnabledFor(logging.INFO):
            frames = json.loads(outcome.backtrace)
            log.info("%s: traceback (most recent call last):\n  %s", outcome.describe(),
                     "\n  ".join(frames), extra=extra)
    elif outcome.kind == "sleep":
        if log.isEnabledFor(logging.INFO):
            log.info("%s: %s in %s (waits for job %s)", outcome.describe(),
                     "sleeping" if status == "sleep" else "woken at once", took, outcome.awaiting,
                     extra=extra)
    elif outcome.kind == "release":
        log.warning("%s: released for another run (no attempt counted)", outcome.describe(),
                    extra=extra)
    elif log.isEnabledFor(logging.INFO):
        log.info("%s: %s in %s", outcome.describe(), status, took, extra=extra)


def _one_line(exc: BaseException) -> str:
    """The database's own message (without its context lines), or the error's text."""
    diag = getattr(getattr(exc, "orig", exc), "diag", None)
    text = getattr(diag, "message_primary", None) or str(exc)
    return " ".join(text.split())[:300] or type(exc).__name__
