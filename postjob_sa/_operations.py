"""The operator's actions on jobs that exist: finish a manual step, reset, cancel, force,
reap, and the queues' limits. :class:`~postjob_sa.JobQueue` has them; each runs in the caller's
transaction, and its validation fails before anything is written."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from postjob_sa import _history, _limits, _session_sql, _validate
from postjob_sa._db import sqlstate
from postjob_sa._migrations import schema_checked
from postjob_sa.durable import events
from postjob_sa.errors import InvalidArgument, InvalidJobState, JobNotFound
from postjob_sa.models import FINAL_STATUSES, MANUAL_WORKFLOW, QueueLimit, Status

#: SQLSTATE unique_violation; and the one reset_jobs raises itself for a key held by another job.
UNIQUE_VIOLATION = "23505"
KEY_HELD_STATE = "PJ002"
#: SQLSTATEs of resolve when the job ended or went meanwhile (invalid_parameter_value,
#: no_data_found).
ENDED_MEANWHILE = "22023"
GONE_MEANWHILE = "P0002"


class JobOperations:
    """The operations of a session-bound queue on existing jobs (see the module docstring)."""

    @property
    def session(self) -> Session:
        """The Session the operations run in (JobQueue's)."""
        raise NotImplementedError

    def _require_job(self, job_id: int) -> str:
        status = self.session.execute(_session_sql.JOB_EXISTS, {"id": job_id}).scalar()
        if status is None:
            raise JobNotFound(f"no job has the id {job_id}")
        return str(status)

    @schema_checked
    def emit_event(self, key: str, payload: Any = None) -> int:
        """Record an event under ``key`` in the caller's transaction; the jobs waiting for it
        (``wait_for_event(key)``) are woken when that commits, and later waits get it too. A
        rollback records and wakes nothing. Returns the event's id."""
        params = {"key": events.key_checked(key),
                  "payload": _validate.to_json(payload, "the event's payload")}
        return int(self.session.execute(_session_sql.EVENT_EMIT, params).scalar_one())

    @schema_checked
    def resolve(self, token: str | uuid.UUID, result: Any = None, *, error: str | None = None) -> int:
        """Finish a manual job by its token: ok with ``result``, or failed with ``error``
        (a message). Wakes its parent. Returns the job id."""
        try:
            token_uuid = token if isinstance(token, uuid.UUID) else uuid.UUID(str(token))
        except ValueError:
            raise InvalidArgument(f"not a token: {token!r}") from None
        payload = _validate.to_json(result, "result")
        if error is not None:
            if not isinstance(error, str):
                raise InvalidArgument("error must be a message string")
            _validate.text(error, "the error message")
        row = self.session.execute(_session_sql.TOKEN_JOB, {"token": str(token_uuid)}).first()
        if row is None:
            raise JobNotFound(f"no job has the token {token_uuid}")
        job_id, workflow, status = row
        if workflow != MANUAL_WORKFLOW:
            raise InvalidJobState(f"job {job_id} is not a manual job")
        if Status(status) in FINAL_STATUSES:
            raise InvalidJobState(f"job {job_id} is already {status}")
        # Another transaction may end the job between the look above and the resolve (another
        # resolve, a cancel): the database refuses then, in a savepoint that keeps the
        # caller's transaction usable.
        savepoint = self.session.begin_nested()
        try:
            self.session.execute(
                _session_sql.JOB_RESOLVE,
                {
                    "token": str(token_uuid), "result": payload,
                    "error": None if error is None else "Resolved",
                    "message": error,
                },
            )
        except DBAPIError as exc:
            if sqlstate(exc) not in (ENDED_MEANWHILE, GONE_MEANWHILE):
                raise
            savepoint.rollback()
            status = self.session.execute(_session_sql.JOB_EXISTS, {"id": job_id}).scalar()
            if status is None:
                raise JobNotFound(f"no job has the token {token_uuid}") from None
            raise InvalidJobState(f"job {job_id} is already {status}") from None
        savepoint.commit()
        return int(job_id)

    @schema_checked
    def reset(self, *ids: int) -> list[int]:
        """Make these jobs (and their failed or timed-out descendants) ready again, attempts
        and errors cleared, with a fresh deadline. Returns the ids reset. A running job is
        refused (InvalidJobState): it would run twice at once; so is a job cancelled while its
        run goes on, until that run has stopped."""
        checked = [_validate.job_id(i) for i in ids]
        if not checked:
            raise InvalidArgument("reset needs at least one job id")
        rows = self.session.execute(_session_sql.JOBS_STATUS_LOCKED, {"ids": checked}).all()
        found: dict[int, str] = {r.id: r.status for r in rows}
        missing = [i for i in checked if i not in found]
        if missing:
            raise JobNotFound(f"no job has the id {', '.join(map(str, missing))}")
        running = [i for i in checked if found[i] == Status.processing.value]
        if running:
            raise InvalidJobState(
                f"job {', '.join(map(str, running))} is running: reset it once it has finished "
                "(or once its worker is gone and `postjob reap` has rescued it)"
            )
        going_on = [r.id for r in rows if r.run_goes_on]
        if going_on:
            raise InvalidJobState(
                f"job {', '.join(map(str, going_on))} was ended while its run went on, and that "
                "run has not stopped yet: reset it once it has (its worker notices within a "
                "heartbeat)"
            )
        # A job whose unique key a newer unfinished job holds cannot hold it again: the unique
        # index (or the function, PJ002) refuses. A savepoint keeps the caller's transaction
        # usable, and the refusal names the holder.
        savepoint = self.session.begin_nested()
        try:
            ids_reset = self.session.execute(_session_sql.JOBS_RESET, {"ids": checked}).scalar_one()
        except DBAPIError as exc:
            if sqlstate(exc) not in (UNIQUE_VIOLATION, KEY_HELD_STATE):
                raise
            savepoint.rollback()
            raise self._key_held(checked, exc) from None
        savepoint.commit()
        return list(ids_reset)

    def _key_held(self, ids: list[int], exc: DBAPIError) -> InvalidJobState:
        row = self.session.execute(_session_sql.JOB_RESET_KEY_HOLDER, {"ids": ids}).first()
        if row is None:  # the holder finished meanwhile: say what the database said
            detail = getattr(getattr(exc.orig, "diag", None), "message_primary", None) or str(exc.orig)
            return InvalidJobState(f"cannot reset job {', '.join(map(str, ids))}: {detail} "
                                   "(try again)")
        return InvalidJobState(
            f"job {row.id} cannot be reset: its unique key {row.unique_key!r} is held by "
            f"unfinished job {row.holder}; cancel or finish job {row.holder} first"
        )

    @schema_checked
    def cancel(self, job_id: int) -> list[int]:
        """Cancel a job and its unfinished descendants: status ``cancelled`` (final) at once.

        A running job is told at its next spawn, result, ``set_workflow_status`` or heartbeat
        (``JobCancelled`` is raised in it) and its outcome is not recorded; a parent waiting
        for a cancelled child sees ``ChildFailed``. Returns the ids cancelled (the job first).
        A finished job is refused (InvalidJobState)."""
        status = self._require_job(_validate.job_id(job_id))
        if Status(status) in FINAL_STATUSES:
            raise InvalidJobState(f"job {job_id} is already {status}: only unfinished jobs can be cancelled")
        ids = list(self.session.execute(_session_sql.JOBS_CANCEL, {"ids": [job_id]}).scalar_one())
        if job_id not in ids:  # it finished between the two statements
            raise InvalidJobState(f"job {job_id} finished before it could be cancelled")
        return [job_id, *(i for i in ids if i != job_id)]

    @schema_checked
    def set_queue_limits(self, queue: str, *, concurrency: int | None = None,
                         rate: int | None = None, period: float = 1.0) -> None:
        """Limit a queue for every worker: at most ``concurrency`` of its jobs processing at
        once, at most ``rate`` starts in any ``period`` seconds (from 1 ms to a year; each
        limit at most 100,000; None: no such limit; both None: the queue is unlimited
        again). Takes effect at the next checkout; a change never strands the starts already
        counted (they are times, not counts)."""
        _limits.set_limits(self.session, _validate.name(queue, "queue"),
                           _validate.count(concurrency, "concurrency"),
                           _validate.count(rate, "rate"), _validate.period(period))

    @schema_checked
    def queue_limits(self) -> list[QueueLimit]:
        """The limited queues, by name."""
        return _limits.list_limits(self.session)

    @schema_checked
    def set_history(self, keep: timedelta | None = None,
                    partition_size: int = _history.DEFAULT_PARTITION_SIZE) -> None:
        """Keep a finished job ``keep`` after it settled (None: for ever; at most a century),
        in ranges of ``partition_size`` job ids (1,000 to 1,000,000,000; the next rotation
        ends the open range that many ids on). Written in the caller's transaction;
        InvalidArgument before anything is written."""
        _history.set_settings(self.session, _history.checked(keep, partition_size))

    @schema_checked
    def history_settings(self) -> _history.HistorySettings:
        """The settings :meth:`set_history` wrote (or the defaults)."""
        return _history.settings(self.session)

    @schema_checked
    def rotate_history(self) -> _history.RotationReport:
        """Create the ranges ahead and drop each range past ``keep`` that holds no job of an
        unfinished tree; returns what it did. One rotation at a time across the fleet (a
        second one meanwhile does nothing, ``busy``). Runs in the caller's transaction: its
        locks are held, and its drops done, until that commits."""
        return _history.rotate(self.session)

    @schema_checked
    def history_status(self) -> list[_history.HistoryRange]:
        """The ranges of the record, by id, the default partition last."""
        return _history.status(self.session)

    @schema_checked
    def force(self, job_id: int) -> None:
        """Run a ready, err or sleeping job as soon as possible."""
        status = self._require_job(_validate.job_id(job_id))
        if status not in ("ready", "err", "sleep"):
            raise InvalidJobState(f"job {job_id} is {status}: only ready, err or sleep jobs can be forced")
        self.session.execute(_session_sql.JOB_FORCE, {"id": job_id})

    @schema_checked
    def reap(self) -> int:
        """Time out jobs past their deadline and fail over jobs whose lease expired (zombies);
        return how many. Every checkout does this too; call it from cron when no worker runs."""
        return int(self.session.execute(_session_sql.JOBS_REAP).scalar_one())
