"""The worker loop: check out, run, record; wait for work; survive outages; stop cleanly.

Lease mode (the default): a checkout commits at once and hands each job a lease and a
fencing token; the job runs outside any transaction; outcomes are recorded in batches by
one ``finish_jobs`` call. Transactional mode: checkout, the job's own writes and its
completion commit together in the worker's Session.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from psycopg2 import InterfaceError, OperationalError
from sqlalchemy.exc import DBAPIError

from postjob_sa import _listener, _sql
from postjob_sa._connections import close_quietly, connect
from postjob_sa._executor import Abort, Outcome, finish_params, run_job
from postjob_sa._heartbeat import Heartbeat
from postjob_sa._migrations import check_revision, read_revision
from postjob_sa.context import RunningJob, _RunContext

if TYPE_CHECKING:
    from postjob_sa.queue import JobQueue

log = logging.getLogger("postjob_sa.worker")

#: The longest a worker sleeps without looking at the queue.
WAIT_CAP = 30.0
#: Outcomes of short jobs are recorded together, at the latest after this many seconds.
FLUSH_INTERVAL = 0.05
RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
#: A busy worker's checkouts reap expired leases and deadlines at most this often; an idle
#: one reaps before it waits, so the checkout after a wake-up does not pay for it.
REAP_INTERVAL = 1.0
_CONNECTION_ERRORS = (OperationalError, InterfaceError)


class _WakeUp(BaseException):
    """Breaks a wait when a stop is requested."""


@dataclass
class WorkerOptions:
    count: int | None = None
    batch: int = 1
    queues: list[str] | None = None
    workflows: list[str] | None = None
    until_idle: bool = False
    handle_signals: bool = True
    all_transactional: bool = False


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc.orig, _CONNECTION_ERRORS)
    return isinstance(exc, _CONNECTION_ERRORS)


class Worker:
    """One worker loop over a JobQueue (see ``JobQueue.work``)."""

    def __init__(self, queue: JobQueue, options: WorkerOptions):
        self.q = queue
        self.opts = options
        reg = queue.registry
        if options.all_transactional:
            self.lease_pairs: tuple[list[str], list[str]] = ([], [])
            self.tx_pairs = reg.pairs(options.workflows)
        else:
            self.lease_pairs = reg.pairs(options.workflows, transactional=False)
            self.tx_pairs = reg.pairs(options.workflows, transactional=True)
        self.conn: Any = None
        self.heartbeat = Heartbeat(queue.engine, queue.lease)
        self.buffer: list[Outcome] = []
        self.buffer_since = 0.0
        self.processed = 0
        self._last_reap = float("-inf")
        self._busy = True  # the first checkout reaps
        self._reaped = False  # whether the last checkout reaped
        self.last_job_id: int | None = None
        self.stop_requested = False
        self._in_job = False
        self._waiting = False
        self._signals = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        with self._signal_handlers():
            try:
                self._connect()
                self._loop()
            finally:
                self._shutdown()
        return self.processed

    def _connect(self) -> None:
        if self.conn is not None:
            return
        self.conn = connect(self.q.engine)
        with self.conn.cursor() as cur:
            check_revision(read_revision(lambda sql: _scalar(cur, sql)))
            cur.execute(_sql.CLIENT_IDENTIFIER_SET_DBAPI, {"identifier": self.q.identifier})
            cur.execute(_sql.APPLICATION_NAME_SET_DBAPI, {"name": f"postjob worker {self.q.identifier}"})
            cur.execute(_sql.WORKER_PREPARE_DBAPI)
        if not self.opts.until_idle:
            _listener.listen(self.conn)

    def _disconnect(self) -> None:
        close_quietly(self.conn)
        self.conn = None

    def _shutdown(self) -> None:
        try:
            self._flush()
        except Exception as exc:
            log.warning("could not record %d outcomes at shutdown: %s", len(self.buffer), exc)
        self.heartbeat.stop()
        self._disconnect()

    def _done(self) -> bool:
        return self.stop_requested or (
            self.opts.count is not None and self.processed >= self.opts.count
        )

    def _loop(self) -> None:
        failures = 0
        while not self._done():
            try:
                self._connect()
                did = 0
                if self.tx_pairs[0]:
                    did += self._transactional_step()
                if self.lease_pairs[0] and not self._done():
                    did += self._lease_batch()
                failures = 0
                if did:
                    continue
                if self.opts.until_idle:
                    if self._reaped or not self.lease_pairs[0]:  # (a transactional checkout reaps)
                        return
                    self._busy, self._last_reap = True, float("-inf")  # reap, then look again
                    continue
                self._wait()
            except Abort:
                return
            except _WakeUp:
                continue
            except Exception as exc:
                if not _is_connection_error(exc):
                    raise
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                log.warning(
                    "database unreachable (%s); reconnecting in %.2fs",
                    " ".join(str(exc).split())[:200], delay,
                )
                self._disconnect()
                self._sleep(delay)

    def _sleep(self, seconds: float) -> None:
        self._waiting = True
        try:
            time.sleep(seconds)
        except _WakeUp:
            pass
        finally:
            self._waiting = False

    # -- waiting -----------------------------------------------------------------------------

    def _wait(self) -> None:
        names, versions = self.lease_pairs[0] + self.tx_pairs[0], self.lease_pairs[1] + self.tx_pairs[1]
        params = {"workflows": names, "versions": versions, "queues": self.opts.queues,
                  "fast": self.q.fast_mode}
        now = time.monotonic()
        with self.conn.cursor() as cur:
            if now - self._last_reap >= REAP_INTERVAL:
                self._last_reap = now
                cur.execute(_sql.WORKER_REAP_AND_TIME_TO_NEXT_DBAPI, params)
            else:
                cur.execute(_sql.WORKER_TIME_TO_NEXT_DBAPI, params)
            ttnj = cur.fetchone()[0]
        if ttnj is not None and ttnj <= 0:
            self._last_reap = float("-inf")  # something is due: reap before the next wait
        timeout = WAIT_CAP if ttnj is None else max(0.0, min(float(ttnj), WAIT_CAP))
        if timeout <= 0:
            return
        self._waiting = True
        try:
            if self.stop_requested:
                return
            _listener.wait(self.conn, timeout)
        except _WakeUp:
            pass
        finally:
            self._waiting = False

    # -- lease mode --------------------------------------------------------------------------

    def _remaining(self) -> int:
        limit = self.opts.batch
        if self.opts.count is not None:
            limit = min(limit, self.opts.count - self.processed)
        return max(limit, 1)

    def _cycle(self, limit: int) -> list[Any]:
        """Record the buffered outcomes and check out up to ``limit`` jobs: one round trip."""
        batch = self.buffer
        names, versions = self.lease_pairs
        now = time.monotonic()
        # a busy worker reaps now and then; after a wait (not busy) the wait just did
        reap = limit > 0 and self._busy and now - self._last_reap >= REAP_INTERVAL
        if reap:
            self._last_reap = now
        if limit > 0:
            self._reaped = reap
        checkout = {
            "workflows": names, "workflow_versions": versions, "queues": self.opts.queues,
            "limit": limit, "lease": self.q.lease, "fast": self.q.fast_mode, "reap": reap,
        }
        with self.conn.cursor() as cur:
            if batch:
                params = finish_params(batch, self.q.fast_mode)
                params.update(checkout)
                cur.execute(_sql.WORKER_CYCLE_DBAPI, params)
            else:
                cur.execute(_sql.WORKER_CHECKOUT_DBAPI, checkout)
            rows: list[Any] = cur.fetchall()
        if limit > 0:
            self._busy = bool(rows)
        self.buffer = []
        if batch:
            self.heartbeat.release([o.job_id for o in batch])
        if self.conn.notices:
            for notice in self.conn.notices:
                log.warning("%s (reaped, reset or resolved meanwhile: outcome not recorded)",
                            notice.strip().removeprefix("NOTICE:  "))
            self.conn.notices.clear()
        return rows

    def _flush(self) -> None:
        if self.buffer and self.conn is not None:
            self._cycle(0)

    def _lease_batch(self) -> int:
        rows = self._cycle(self._remaining())
        if not rows:
            return 0
        jobs = [RunningJob(*r) for r in rows]
        self.heartbeat.hold({j.id: j.lease_token for j in jobs if j.lease_token is not None})
        registry = self.q.registry.workflows
        cursor = self.conn.cursor
        info = log.isEnabledFor(logging.INFO)
        for index, job in enumerate(jobs):
            if self.stop_requested:
                self._release(jobs[index:])
                break
            started = time.monotonic()
            self._in_job = True
            try:
                outcome = run_job(_RunContext(job, cursor_factory=cursor), registry[job.workflow])
            except Abort:
                self._in_job = False
                log.warning("job %s interrupted: released for retry", job.id)
                self._release(jobs[index:])
                self._flush()
                raise
            finally:
                self._in_job = False
            ended = time.monotonic()
            if info:
                log.info("job %s: %s in %.1f ms", job.id, outcome.kind, (ended - started) * 1000)
            if not self.buffer:
                self.buffer_since = ended
            self.buffer.append(outcome)
            self.processed += 1
            self.last_job_id = job.id
            if ended - self.buffer_since >= FLUSH_INTERVAL:
                try:
                    self._flush()
                except BaseException:
                    # the flush failed (connection lost): the jobs not run yet go back with
                    # the buffered outcomes after the reconnect; else the heartbeat would hold
                    # their leases for as long as this worker lives
                    self._release(jobs[index + 1 :])
                    raise
        return len(jobs)

    def _release(self, jobs: list[RunningJob]) -> None:
        for job in jobs:
            self.buffer.append(Outcome(job.id, job.lease_token, "release"))

    # -- transactional mode ------------------------------------------------------------------

    def _transactional_step(self) -> int:
        session = self.q.session
        names, versions = self.tx_pairs
        try:
            row = session.execute(
                _sql.JOB_CHECKOUT,
                {
                    "workflows": names, "versions": versions, "queues": self.opts.queues,
                    "limit": 1, "lease": self.q.lease, "fast": self.q.fast_mode,
                },
            ).mappings().first()
            if row is None:
                session.rollback()
                return 0
            job = _running_job(row)
            wf = self.q.registry.get(job.workflow)
            assert wf is not None
            dbapi = session.connection().connection.dbapi_connection
            assert dbapi is not None
            ctx = _RunContext(job, cursor_factory=dbapi.cursor, session=session)
            savepoint = session.begin_nested()
            self._in_job = True
            try:
                outcome = run_job(ctx, wf)
            finally:
                self._in_job = False
            if outcome.kind in ("err", "failed"):
                savepoint.rollback()
            elif savepoint.is_active:
                savepoint.commit()
            session.execute(_sql.JOB_FINISH, finish_params([outcome], self.q.fast_mode))
            session.commit()
            self.processed += 1
            self.last_job_id = job.id
            log.info("job %s: %s (transactional)", job.id, outcome.kind)
            return 1
        except BaseException:
            session.rollback()
            raise

    # -- signals -----------------------------------------------------------------------------

    @contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if not self.opts.handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, self._on_signal)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self.stop_requested = True
        if self._signals == 1:
            log.warning(
                "received %s: stopping after the current job (send again to stop at once)",
                signal.Signals(signum).name,
            )
            if self._waiting:
                raise _WakeUp()
            return
        log.warning("received %s again: stopping now", signal.Signals(signum).name)
        if self._in_job:
            raise Abort()
        if self._waiting:
            raise _WakeUp()


def _scalar(cur: Any, sql: str) -> Any:
    cur.execute(sql)
    row = cur.fetchone()
    return None if row is None else row[0]


def _running_job(row: Any) -> RunningJob:
    """A RunningJob from a mapping row (the transactional path's full checkout row)."""
    return RunningJob(
        row["id"], row["lease_token"], row["workflow"], row["workflow_version"], row["args"],
        row["queue"], row["root_id"], row["full_id"], row["parent_id"],
    )
