"""The worker loop: check out, run, record; wait for work; survive outages; stop cleanly.

A worker is built from an engine, a registry and :class:`WorkerOptions`; it owns its connections
(taken from the engine, see ``postjob_sa._db``) and never reads the caller's session. Lease mode
(the default): a checkout commits at once and hands each job a lease and a fencing token; the job
runs outside any transaction; outcomes are recorded in batches with the next checkout
(``recorder``) and the keeper (``keeper``) beats and records what would otherwise wait. With
``concurrency`` above one, up to that many jobs run at once (``slots``): the loop keeps the slots
filled. Transactional mode runs one job per transaction (``transactional``), one at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import Engine

from postjob_sa import _metrics
from postjob_sa._db import Conn, close_quietly
from postjob_sa._migrations import check_revision, head_revision, read_oldest_served, read_revision
from postjob_sa.context import RunningJob, _RunContext
from postjob_sa.registry import Registry
from postjob_sa.worker import rescues
from postjob_sa.worker.executor import Outcome, run_job, run_job_async
from postjob_sa.worker.idle import Idle
from postjob_sa.worker.keeper import Keeper
from postjob_sa.worker.options import WorkerOptions
from postjob_sa.worker.outages import Outages
from postjob_sa.worker.recorder import Recorder, job_fields
from postjob_sa.worker.scheduler import Scheduler
from postjob_sa.worker.signals import Abort, Stopper, WakeUp
from postjob_sa.worker.slots import JobLoop, Slots
from postjob_sa.worker.transactional import TransactionalRunner
from postjob_sa.worker.unknown import UnknownWorkflows
from postjob_sa.worker.upkeep import Upkeep
from postjob_sa.worker.wakeup import choose_waker

log = logging.getLogger("postjob_sa.worker")


class Worker:
    """One worker loop (see ``JobQueue.work``)."""

    def __init__(self, engine: Engine, registry: Registry, options: WorkerOptions):
        self.engine = engine
        self.registry = registry
        self.opts = options
        #: a worker built on options that never found out (None) takes it for a direct one
        self.pooled = pooled = options.pooled is True
        if options.transactional:
            self.lease_pairs: tuple[list[str], list[str]] = ([], [])
            tx = None
        else:
            self.lease_pairs = registry.pairs(options.workflows, transactional=False)
            tx = True
        # transactional jobs: sync ones on a connection of the worker's, async ones on an
        # async connection on the event loop (their checkout already needs the right one)
        self.tx_pairs_sync = registry.pairs(options.workflows, transactional=tx, is_async=False)
        self.tx_pairs_async = registry.pairs(options.workflows, transactional=tx, is_async=True)
        self.tx_pairs = (self.tx_pairs_sync[0] + self.tx_pairs_async[0],
                         self.tx_pairs_sync[1] + self.tx_pairs_async[1])
        self.recorder = Recorder(lease=options.lease)
        self.keeper = Keeper(
            engine, self.recorder, lease=options.lease, identifier=options.identifier,
            revision=head_revision(), workflows=self.lease_pairs[0] + self.tx_pairs[0],
            versions=self.lease_pairs[1] + self.tx_pairs[1], queues=options.queues,
            pooled=pooled, companions=[Upkeep(engine, options)],
        )
        # periodic workflows: ticked by long-running workers (not by drain/step)
        self.scheduler = Scheduler(registry, [] if options.until_idle else options.workflows)
        self.tx_runner = TransactionalRunner(engine, registry, lease=options.lease,
                                             fast_mode=options.fast_mode, pooled=pooled)
        self.slots = (Slots(options.concurrency, engine, self.job_loop, self._on_done,
                            lost=self.keeper.is_lost, pooled=pooled,
                            fast_mode=options.fast_mode)
                      if options.concurrency > 1 else None)
        self.waker = options.waker or choose_waker(pooled, options.wakeup_url,
                                                   options.poll_interval, options.identifier)
        self.stopper = Stopper()
        self.unknown = UnknownWorkflows()  # due jobs no running worker knows: warn
        self.conn: Conn | None = None
        self.started = 0  # jobs handed to a run
        self.ran = 0  # runs that ended
        self.tx_recorded = 0
        self.last_job_id: int | None = None
        self._count_lock = threading.Lock()
        self._job_loop: JobLoop | None = None
        self._interrupt: BaseException | None = None
        self.idle = Idle(waker=self.waker, keeper=self.keeper, scheduler=self.scheduler,
                         stopper=self.stopper, unknown=self.unknown, params=self._idle_params)
        self._backlog = False  # the last checkout filled every free slot

    @property
    def stop_requested(self) -> bool:
        return self.stopper.requested

    def job_loop(self) -> JobLoop:
        """The event loop of async jobs, started when the first one comes."""
        if self._job_loop is None:
            self._job_loop = JobLoop()
        return self._job_loop

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        """Work until told to stop; returns how many runs were recorded."""
        with self.stopper.handlers(self.opts.handle_signals):
            try:
                self._connect()
                assert self.conn is not None
                self.keeper.register(self.conn)
                self.keeper.attach(self.conn)
                self.waker.own_channel(self.conn, self.keeper.worker_id)
                self.scheduler.register(self.conn)
                self.unknown.check(self.conn)
                self.keeper.start()
                self._loop()
                self._finish_running()
            except Abort:
                self._hand_back_running()
            finally:
                self._shutdown()
        if self._interrupt is not None:
            raise self._interrupt
        return self.recorder.recorded + self.tx_recorded

    def _connect(self) -> None:
        if self.conn is not None:
            return
        conn = Conn.open(self.engine, name=f"postjob worker {self.opts.identifier}",
                         pooled=self.pooled)
        try:
            check_revision(read_revision(conn.scalar), read_oldest_served(conn.scalar))
            if not self.opts.until_idle:
                self.waker.attach(conn)
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def _disconnect(self) -> None:
        close_quietly(self.conn)
        self.conn = None
        self.waker.reset()

    def _shutdown(self) -> None:
        self.keeper.halt()
        try:
            self._flush()
        except Exception as exc:
            log.warning("could not record %d outcomes at shutdown (their jobs are rescued when "
                        "their lease ends): %s", len(self.recorder.take()), exc)
        self.keeper.unregister(self.conn)
        self._disconnect()
        self.waker.close()
        if self.slots is not None:
            self.slots.close()
        if self._job_loop is not None:
            try:
                self._job_loop.submit(self.tx_runner.close_async()).result(timeout=5)
            except Exception as exc:  # its connections close with the process
                log.debug("closing the async engine: %s", exc)
            self._job_loop.close()
        self.stopper.close()

    def _done(self) -> bool:
        count = self.opts.count
        return self.stop_requested or (count is not None and self.started >= count)

    def _loop(self) -> None:
        outages = Outages()
        while not self._done():
            try:
                self._connect()
                assert self.conn is not None
                self.keeper.beat_if_due(self.conn)
                self.keeper.attach(self.conn)  # again after a reconnection or registration
                if self.waker.private and self.waker.worker_id != self.keeper.worker_id:
                    self.waker.own_channel(self.conn, self.keeper.worker_id)  # registered anew
                self.scheduler.tick_if_due(self.conn)
                did = self._transactional_step(self.conn) if self.tx_pairs[0] else 0
                if self.lease_pairs[0] and not self._done():
                    did += self._fill_slots() if self.slots else self._lease_batch()
                outages.passed()
                if did:
                    self.idle.worked()
                    continue
                if self.opts.until_idle:
                    if self.slots is not None and self.slots.busy:
                        self._wait_for_slots(self.slots.capacity)  # their children may be due next
                        continue
                    if self.idle.reaped:
                        return
                    self.idle.reap(self.conn)
                    continue
                self.idle.wait(self.conn, can_take=self.slots is None or bool(self.slots.free))
            except WakeUp:
                continue
            except Exception as exc:
                plan = outages.plan(exc)  # logged there
                if plan is None:
                    raise
                pause, reconnect = plan
                if reconnect:
                    self._disconnect()
                self._sleep(pause)

    def _sleep(self, seconds: float) -> None:
        try:
            with self.stopper.pausing():
                time.sleep(seconds)
        except WakeUp:
            pass

    # -- what an idle worker asks for ------------------------------------------------------

    def _idle_params(self, reap: bool) -> dict[str, Any]:
        names, versions = self.lease_pairs[0] + self.tx_pairs[0], self.lease_pairs[1] + self.tx_pairs[1]
        return {"worker_id": self.keeper.worker_id if self.waker.private else None,
                "workflows": names, "versions": versions, "queues": self.opts.queues,
                "reap": reap}

    # -- lease mode, one job at a time -------------------------------------------------------

    def _remaining(self, limit: int) -> int:
        if self.opts.count is not None:
            limit = min(limit, self.opts.count - self.started)
        return max(limit, 1)

    def _checkout(self, limit: int) -> list[RunningJob]:
        """Record the buffered outcomes and check out up to ``limit`` jobs: one round trip."""
        assert self.conn is not None
        reap = self.idle.reap_at_checkout()
        names, versions = self.lease_pairs
        checkout = {"workflows": names, "versions": versions,
                    "queues": self.opts.queues, "limit": limit, "reap": reap,
                    "promote": self.idle.promote_at_checkout()}
        seen = rescues.look(self.conn) if reap else []
        jobs = self.recorder.cycle(self.conn, self.recorder.take(), checkout,
                                   self.keeper.worker_id)
        rescues.report(self.conn, seen)
        self.idle.checked_out(bool(jobs), reap)
        if jobs:
            token = jobs[0].lease_token  # one checkout, one lease
            assert token is not None
            self.keeper.hold((j.id, token) for j in jobs)
            self.started += len(jobs)
            _metrics.started_many(Counter((j.workflow, j.queue) for j in jobs))
        if jobs and len(jobs) == limit:
            self.waker.backlog()
        return jobs

    def _lease_batch(self) -> int:
        """Check out a batch and run its jobs one after the other, in this thread."""
        jobs = self._checkout(self._remaining(self.opts.batch))
        for index, job in enumerate(jobs):
            if self.stop_requested:
                self._release(jobs[index:])
                break
            outcome = self._run_one(job, jobs[index + 1 :])
            self._on_done(job, outcome)
            if self._interrupt is not None:
                self._release(jobs[index + 1 :])
                self._flush()
                raise self._take_interrupt()
        return len(jobs)

    def _run_one(self, job: RunningJob, rest: list[RunningJob]) -> Outcome:
        wf = self.registry.workflows[job.workflow]
        assert self.conn is not None
        ctx = _RunContext(job, db=self.conn, lost=self.keeper.is_lost,
                          fast_mode=self.opts.fast_mode)
        future = None
        try:
            with self.stopper.running():
                if not wf.is_async:
                    return run_job(ctx, wf)
                future = self.job_loop().submit(run_job_async(ctx, wf))
                return self.stopper.wait_for(future)  # an abort reaches this thread
        except Abort:
            if future is not None:
                future.cancel()
            log.warning("job %s interrupted: released for another run", job.id)
            self._release([job, *rest])
            self._flush()
            raise

    def _take_interrupt(self) -> BaseException:
        interrupt, self._interrupt = self._interrupt, None
        assert interrupt is not None
        return interrupt

    def _on_done(self, job: RunningJob, outcome: Outcome) -> None:
        """A run ended (in this thread, a slot's thread or the event loop's)."""
        with self._count_lock:
            self.ran += 1
        if outcome.kind == "lost":
            why = ("cancelled while it ran" if outcome.error == "cancelled" else
                   "lease lost during the run (reaped, reset or resolved meanwhile)")
            log.warning("%s: %s: the run is abandoned", outcome.describe(), why,
                        extra=job_fields(outcome))
            _metrics.lease_lost(job.workflow)
            self.keeper.stop([job.id])
            return
        if self.recorder.add(outcome):
            self.keeper.nudge()
        if outcome.interrupt is not None:
            log.warning("%s: interrupted by %s: recording it and handing back the jobs not "
                        "started", outcome.describe(), type(outcome.interrupt).__name__)
            self._interrupt = outcome.interrupt
            self.stopper.requested = True

    def _release(self, jobs: list[RunningJob]) -> None:
        for job in jobs:
            self.recorder.add(Outcome(job.id, job.lease_token, "release", workflow=job.workflow))

    def _flush(self) -> None:
        """Record every buffered outcome now (and the runs that stopped without one), on the
        worker's own connection."""
        outcomes = self.recorder.take()
        if not outcomes and not self.recorder.held.has_stopped:
            return
        if self.conn is None:
            self.recorder.put_back(outcomes)
            raise ConnectionError("no connection to record the outcomes on")
        self.recorder.cycle(self.conn, outcomes, None, self.keeper.worker_id)

    # -- lease mode, several jobs at once ------------------------------------------------------

    def _fill_slots(self) -> int:
        """Hand every free place a job (one round trip for all); with too few free, wait.

        The slots hold a few jobs more than they run at once (see ``Slots``): the loop refills
        once half of those extra ones have started, so a round trip is never on the way of a
        slot that frees up."""
        slots = self.slots
        assert slots is not None
        refill_at = max(1, slots.prefetch // 2)
        if self._backlog and slots.free < refill_at:
            self._wait_for_slots(refill_at)
            if slots.free < refill_at:
                return 1  # still full (a beat may be due): look again
        free = slots.free
        jobs = self._checkout(self._remaining(free))
        self._backlog = len(jobs) == free
        for job in jobs:
            slots.start(job, self.registry.workflows[job.workflow])
        return len(jobs)

    def _wait_for_slots(self, free: int) -> None:
        assert self.slots is not None
        if self.stopper.aborted:
            raise Abort()
        with self.stopper.running():  # a second signal hands the running jobs back
            self.slots.wait(free, max(0.01, min(self.keeper.seconds_to_beat(), 1.0)))

    def _finish_running(self) -> None:
        """After the loop: hand back the jobs no slot has begun, let the running ones end (a
        second signal hands them back too)."""
        if self.slots is None:
            return
        if self.stop_requested:  # (a count reached lets every job handed over run)
            self._release(self.slots.take_unstarted())
        if not self.slots.busy:
            return
        log.info("waiting for %d running job(s) to end", self.slots.busy)
        while self.slots.busy:
            self._wait_for_slots(self.slots.capacity)
            if self.conn is not None:
                self.keeper.beat_if_due(self.conn)

    def _hand_back_running(self) -> None:
        jobs = self.slots.abandon() if self.slots is not None else []
        if jobs:
            log.warning("handing back %d running job(s)", len(jobs))
            self._release(jobs)

    # -- transactional mode ------------------------------------------------------------------

    def _transactional_step(self, conn: Conn) -> int:
        did = 0
        self.tx_runner.promote_if_due(conn, self.tx_pairs)
        for (names, versions), is_async in ((self.tx_pairs_sync, False), (self.tx_pairs_async, True)):
            if not names or self._done():
                continue
            params = {"worker_id": self.keeper.worker_id, "identifier": self.opts.identifier,
                      "workflows": names, "versions": versions, "queues": self.opts.queues,
                      "limit": 1, "lease": self.opts.lease}
            with self.stopper.running():
                if is_async:
                    job_id = self.job_loop().submit(self.tx_runner.step_async(params)).result()
                else:
                    job_id = self.tx_runner.step(params)
            if job_id is not None:
                self.waker.backlog()  # it asked for one and got it
                self.started += 1
                self.ran += 1
                self.tx_recorded += 1
                self.last_job_id = job_id
                did += 1
        return did

    @property
    def last_recorded(self) -> int | None:
        """The id of the last job whose outcome was recorded."""
        return self.last_job_id or self.recorder.last_recorded
