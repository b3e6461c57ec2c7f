"""Transactional mode: one job, one transaction. Its checkout, its own writes and its outcome
commit together, on a connection the worker takes from the engine (never the caller's session).

The workflow gets a Session joined to that transaction: its ``commit()`` and ``rollback()`` act
on a savepoint, so a workflow that rolls back its own work does not undo its checkout. All the
job's writes sit inside one more savepoint of the runner's, which an error rolls back whole
before the error is recorded. The outcome must be accepted (the job still held by this
checkout) or nothing of the run commits.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from postjob_sa import _sql
from postjob_sa._db import Conn, check_driver
from postjob_sa._executor import Outcome, error_name, finish_params, run_job
from postjob_sa._recorder import log_outcome
from postjob_sa.context import RunningJob, _RunContext
from postjob_sa.errors import InvalidJobState
from postjob_sa.registry import Registry

log = logging.getLogger("postjob_sa.worker")
_UNDONE = ("the run undid the worker's transaction (did the workflow run ROLLBACK or COMMIT "
           "on the connection itself?)")


class TransactionalRunner:
    """Runs transactional jobs one at a time (see the module docstring)."""

    def __init__(self, engine: Engine, registry: Registry, *, lease: float, fast_mode: bool):
        self.engine = engine
        self.driver = check_driver(engine)
        self.registry = registry
        self.lease = lease
        self.fast_mode = fast_mode

    def step(self, checkout: dict[str, Any]) -> int | None:
        """Run one job; its id once its outcome is committed, None if none was due."""
        with self.engine.connect() as conn:
            trans = conn.begin()
            try:
                row = conn.execute(_sql.JOB_CHECKOUT, checkout).mappings().first()
                if row is None:
                    trans.rollback()
                    return None
                job = RunningJob(**{f: row[f] for f in RunningJob._fields})
                outcome = self._run(conn, job)
                accepted = conn.execute(
                    _sql.JOB_FINISH, finish_params([outcome], self.fast_mode)
                ).scalar_one()
                if job.id not in accepted:
                    # the run undid the checkout (a raw ROLLBACK on the connection): commit
                    # nothing of it, and stop rather than run the job again and again
                    trans.rollback()
                    raise InvalidJobState(
                        f"{outcome.describe()}: {_UNDONE}; nothing of it was committed")
                status = conn.execute(_sql.JOB_EXISTS, {"id": job.id}).scalar_one()
                trans.commit()
            except BaseException:
                if trans.is_active:
                    trans.rollback()
                raise
        log_outcome(outcome, str(status))
        if outcome.interrupt is not None:
            raise outcome.interrupt
        return job.id

    def _run(self, conn: Connection, job: RunningJob) -> Outcome:
        wf = self.registry.get(job.workflow)
        assert wf is not None
        writes = conn.begin_nested()  # every write of the job, whatever it commits itself
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        dbapi = conn.connection.dbapi_connection
        ctx = _RunContext(job, db=Conn.borrow(dbapi, self.driver), session=session)
        try:
            outcome = run_job(ctx, wf)
            if outcome.kind in ("ok", "sleep"):
                session.commit()  # what the workflow left pending belongs to its result
        except Exception as exc:  # the session could not commit: the job's writes are broken
            outcome = Outcome(job.id, job.lease_token, "err", error=error_name(exc),
                              message=f"the job's writes could not be committed: {exc}",
                              version=wf.version, workflow=job.workflow)
        finally:
            session.close()
        if outcome.kind in ("ok", "sleep") and writes.is_active:
            try:
                writes.commit()
                return outcome
            except Exception as exc:
                outcome = Outcome(job.id, job.lease_token, "err", error=error_name(exc),
                                  message=f"the job's writes could not be committed: {exc}",
                                  version=wf.version, workflow=job.workflow)
        try:
            if writes.is_active:
                writes.rollback()
        except Exception as exc:
            raise InvalidJobState(
                f"{outcome.describe()}: {_UNDONE}; nothing of it was committed") from exc
        if outcome.kind == "lost":  # cannot happen while we hold the row; be safe
            outcome = Outcome(job.id, job.lease_token, "release", workflow=job.workflow)
        return outcome
