"""The worker loop: check out, run, record; wait for work; survive outages; stop cleanly.

A worker is built from an engine, a registry and :class:`WorkerOptions`; it owns its connections
(taken from the engine, see ``_db``) and never reads the caller's session. Lease mode (the
default): a checkout commits at once and hands each job a lease and a fencing token; the job runs
outside any transaction; outcomes are recorded in batches with the next checkout (``_recorder``),
and the keeper thread (``_keeper``) beats and records what would otherwise wait. Transactional
mode runs one job per transaction (``_transactional``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from sqlalchemy import Engine

from postjob_sa import _sql
from postjob_sa._db import Conn, Failure, close_quietly, failure, worker_identifier
from postjob_sa._executor import Abort, Outcome, run_job
from postjob_sa._keeper import Keeper
from postjob_sa._migrations import check_revision, head_revision, read_oldest_served, read_revision
from postjob_sa._recorder import Recorder
from postjob_sa._transactional import TransactionalRunner
from postjob_sa._unknown import UnknownWorkflows
from postjob_sa.context import RunningJob, _RunContext
from postjob_sa.registry import Registry

log = logging.getLogger("postjob_sa.worker")

#: The longest a worker sleeps without looking at the queue.
WAIT_CAP = 30.0
RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
#: A busy worker's checkouts reap expired leases and deadlines at most this often; an idle
#: one reaps before it waits, so the checkout after a wake-up does not pay for it.
REAP_INTERVAL = 1.0
#: How long an idle worker waits when a job is due that its checkout could not take (another
#: transaction holds its row): the n-th such miss in a row waits the n-th delay (a NOTIFY still
#: wakes it at once), so the worker never spins on a locked job.
MISS_DELAYS = (0.0, 0.02, 0.1, 0.25, 0.5, 1.0)
#: Deadlocks met by a checkout in a row before the worker gives up.
TRANSIENT_LIMIT = 10


class _WakeUp(BaseException):
    """Breaks a wait when a stop is requested."""


@dataclass
class WorkerOptions:
    """How a worker runs (``JobQueue`` builds them from its own arguments)."""

    lease: float = 60.0
    batch: int = 1
    fast_mode: bool = False
    identifier: str = field(default_factory=worker_identifier)
    queues: list[str] | None = None
    workflows: list[str] | None = None
    count: int | None = None
    until_idle: bool = False
    handle_signals: bool = True
    #: run every job in transactional mode (``JobQueue.step(transactional=True)``)
    transactional: bool = False


class Worker:
    """One worker loop (see ``JobQueue.work``)."""

    def __init__(self, engine: Engine, registry: Registry, options: WorkerOptions):
        self.engine = engine
        self.registry = registry
        self.opts = options
        if options.transactional:
            self.lease_pairs: tuple[list[str], list[str]] = ([], [])
            self.tx_pairs = registry.pairs(options.workflows)
        else:
            self.lease_pairs = registry.pairs(options.workflows, transactional=False)
            self.tx_pairs = registry.pairs(options.workflows, transactional=True)
        self.recorder = Recorder(fast_mode=options.fast_mode, lease=options.lease)
        self.keeper = Keeper(
            engine, self.recorder, lease=options.lease, identifier=options.identifier,
            revision=head_revision(), workflows=self.lease_pairs[0] + self.tx_pairs[0],
            queues=options.queues,
        )
        self.tx_runner = TransactionalRunner(engine, registry, lease=options.lease,
                                             fast_mode=options.fast_mode)
        self.unknown = UnknownWorkflows()  # due jobs no running worker knows: warn
        self.conn: Conn | None = None
        self.ran = 0  # runs finished (recorded or not yet)
        self.tx_recorded = 0
        self.last_job_id: int | None = None
        self.stop_requested = False
        self._last_reap = float("-inf")
        self._busy = True  # the first checkout reaps
        self._idle_reaped = False  # reaped since the last job ran (drain: then it is done)
        self._misses = 0
        self._in_job = False
        self._waiting = False
        self._signals = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        """Work until told to stop; returns how many runs were recorded."""
        with self._signal_handlers():
            try:
                self._connect()
                assert self.conn is not None
                self.keeper.register(self.conn)
                self.unknown.check(self.conn)
                self.keeper.start()
                self._loop()
            finally:
                self._shutdown()
        return self.recorder.recorded + self.tx_recorded

    def _connect(self) -> None:
        if self.conn is not None:
            return
        conn = Conn.open(self.engine)
        try:
            check_revision(read_revision(conn.scalar), read_oldest_served(conn.scalar))
            conn.scalar(_sql.WORKER_NAME_SET, {"name": f"postjob worker {self.opts.identifier}"})
            if not self.opts.until_idle:
                conn.listen(_sql.WORKER_LISTEN)
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def _disconnect(self) -> None:
        close_quietly(self.conn)
        self.conn = None

    def _shutdown(self) -> None:
        self.keeper.stop()
        try:
            self._flush()
        except Exception as exc:
            log.warning("could not record %d outcomes at shutdown (their jobs are rescued when "
                        "their lease ends): %s", len(self.recorder.take()), exc)
        self.keeper.unregister(self.conn)
        self._disconnect()

    def _done(self) -> bool:
        return self.stop_requested or (self.opts.count is not None and self.ran >= self.opts.count)

    def _loop(self) -> None:
        failures = 0
        transient = 0
        while not self._done():
            try:
                self._connect()
                assert self.conn is not None
                self.keeper.beat_if_due(self.conn)
                did = self._transactional_step() if self.tx_pairs[0] else 0
                if self.lease_pairs[0] and not self._done():
                    did += self._lease_batch()
                failures = transient = 0
                if did:
                    self._misses = 0
                    self._idle_reaped = False
                    continue
                if self.opts.until_idle:
                    if self._idle_reaped:
                        return
                    self._reap()
                    continue
                self._wait()
            except Abort:
                return
            except _WakeUp:
                continue
            except Exception as exc:
                kind = failure(exc)
                message = " ".join(str(exc).split())[:300]
                if kind is Failure.TRANSIENT and transient < TRANSIENT_LIMIT:
                    transient += 1
                    log.warning("%s: trying again", message)
                    self._sleep(0.05 * transient)
                    continue
                if kind is not Failure.CONNECTION:
                    raise
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                log.warning("database unreachable (%s); reconnecting in %.2fs", message, delay)
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

    def _idle_params(self, reap: bool) -> dict[str, Any]:
        names, versions = self.lease_pairs[0] + self.tx_pairs[0], self.lease_pairs[1] + self.tx_pairs[1]
        return {"workflows": names, "workflow_versions": versions, "queues": self.opts.queues,
                "reap": reap}

    def _reap(self) -> None:
        assert self.conn is not None
        self.conn.scalar(_sql.WORKER_IDLE, self._idle_params(True))
        self._last_reap = time.monotonic()
        self._idle_reaped = True

    def _wait(self) -> None:
        assert self.conn is not None
        self.unknown.check_if_due(self.conn)
        now = time.monotonic()
        reap = now - self._last_reap >= REAP_INTERVAL
        if reap:
            self._last_reap = now
        ttnj = self.conn.scalar(_sql.WORKER_IDLE, self._idle_params(reap))
        if ttnj is not None and ttnj <= 0:
            # due now, yet the checkout found nothing to take: its row is locked by another
            # transaction (or it just became due); look again, less and less often
            timeout = MISS_DELAYS[min(self._misses, len(MISS_DELAYS) - 1)]
            self._misses += 1
        else:
            self._misses = 0
            timeout = WAIT_CAP if ttnj is None else min(float(ttnj), WAIT_CAP)
        timeout = min(timeout, self.keeper.seconds_to_beat())
        if timeout <= 0 or self.stop_requested:
            return
        self._waiting = True
        try:
            self.conn.wait(timeout)
        except _WakeUp:
            pass
        finally:
            self._waiting = False

    # -- lease mode --------------------------------------------------------------------------

    def _remaining(self) -> int:
        limit = self.opts.batch
        if self.opts.count is not None:
            limit = min(limit, self.opts.count - self.ran)
        return max(limit, 1)

    def _lease_batch(self) -> int:
        """Record the buffered outcomes and check out the next jobs (one round trip), then
        run them one after the other."""
        assert self.conn is not None
        limit = self._remaining()
        now = time.monotonic()
        # a busy worker reaps now and then; after a wait (not busy) the wait just did
        reap = self._busy and now - self._last_reap >= REAP_INTERVAL
        if reap:
            self._last_reap = now
        names, versions = self.lease_pairs
        checkout = {"workflows": names, "workflow_versions": versions,
                    "queues": self.opts.queues, "limit": limit, "reap": reap}
        outcomes = self.recorder.take()
        rows = self.recorder.cycle(self.conn, outcomes, checkout, self.keeper.worker_id,
                                   self.opts.identifier)
        self.keeper.release(o.job_id for o in outcomes)
        self._busy = bool(rows)
        if not rows:
            self._idle_reaped = self._idle_reaped or reap
            return 0
        jobs = [RunningJob(**{f: r[f] for f in RunningJob._fields}) for r in rows]
        self.keeper.hold((j.id, j.lease_token) for j in jobs if j.lease_token is not None)
        for index, job in enumerate(jobs):
            if self.stop_requested:
                self._release(jobs[index:])
                break
            outcome = self._run_one(job, jobs[index + 1 :])
            self.ran += 1
            if outcome.kind == "lost":
                log.warning("%s: lease lost during the run (reaped, reset or resolved "
                            "meanwhile): the run is abandoned", outcome.describe())
                self.keeper.release([job.id])
                continue
            self.recorder.add(outcome)
            self.keeper.nudge()
            if outcome.interrupt is not None:
                log.warning("%s: interrupted by %s: recording it and handing back the rest of "
                            "the batch", outcome.describe(), type(outcome.interrupt).__name__)
                self._release(jobs[index + 1 :])
                self._flush()
                raise outcome.interrupt
        return len(jobs)

    def _run_one(self, job: RunningJob, rest: list[RunningJob]) -> Outcome:
        wf = self.registry.workflows[job.workflow]
        assert self.conn is not None
        self._in_job = True
        try:
            return run_job(_RunContext(job, db=self.conn), wf)
        except Abort:
            self._in_job = False
            log.warning("job %s interrupted: released for another run", job.id)
            self._release([job, *rest])
            self._flush()
            raise
        finally:
            self._in_job = False

    def _release(self, jobs: list[RunningJob]) -> None:
        for job in jobs:
            self.recorder.add(Outcome(job.id, job.lease_token, "release", workflow=job.workflow))

    def _flush(self) -> None:
        """Record every buffered outcome now, on the worker's own connection."""
        outcomes = self.recorder.take()
        if not outcomes:
            return
        if self.conn is None:
            self.recorder.put_back(outcomes)
            raise ConnectionError("no connection to record the outcomes on")
        self.recorder.cycle(self.conn, outcomes, None, self.keeper.worker_id, self.opts.identifier)
        self.keeper.release(o.job_id for o in outcomes)

    # -- transactional mode ------------------------------------------------------------------

    def _transactional_step(self) -> int:
        names, versions = self.tx_pairs
        self._in_job = True
        try:
            job_id = self.tx_runner.step({
                "worker_id": self.keeper.worker_id, "identifier": self.opts.identifier,
                "workflows": names, "versions": versions, "queues": self.opts.queues,
                "limit": 1, "lease": self.opts.lease,
            })
        finally:
            self._in_job = False
        if job_id is None:
            return 0
        self.ran += 1
        self.tx_recorded += 1
        self.last_job_id = job_id
        return 1

    @property
    def last_recorded(self) -> int | None:
        """The id of the last job whose outcome was recorded."""
        return self.last_job_id or self.recorder.last_recorded

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
