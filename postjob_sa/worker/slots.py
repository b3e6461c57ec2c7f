"""Running jobs: one at a time in the worker's own thread, or up to N at once.

``async def`` workflows run as tasks on one event loop, in a thread of its own (so a worker
can run them whatever the caller's loop, and the worker loop and the heartbeat never wait for
it); sync workflows run in the worker's thread (one at a time) or in N threads of a pool. A
watchdog notices when an async job blocks the event loop and says which jobs were on it.

A job's outcome goes to the recorder as soon as it ends; the worker loop learns that a slot
is free through :meth:`Slots.wait`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sqlalchemy import Engine

from postjob_sa._db import Conn, close_quietly
from postjob_sa.context import RunningJob, _RunContext
from postjob_sa.registry import Workflow
from postjob_sa.worker.executor import Outcome, run_job, run_job_async
from postjob_sa.worker.signals import Abort, raise_in

log = logging.getLogger("postjob_sa.worker")
T = TypeVar("T")

#: The watchdog's period, and how late the event loop may answer before it says so.
WATCHDOG_PERIOD = 0.5
WATCHDOG_LATE = 1.0
#: How long :meth:`Slots.abandon` waits for the code of the jobs it interrupts to stop.
ABANDON_WAIT = 2.0


class JobLoop:
    """An event loop in a daemon thread of its own, for ``async def`` workflows."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="postjob-async-jobs", daemon=True)
        self._thread.start()
        self._answered = time.monotonic()
        self._watching = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="postjob-async-watchdog",
                                          daemon=True)
        self._watchdog.start()
        self.running: dict[int, str] = {}  # job id -> workflow, for the watchdog's message

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _answer(self) -> None:
        self._answered = time.monotonic()

    def _watch(self) -> None:
        warned_at = 0.0
        while not self._watching.wait(WATCHDOG_PERIOD):
            late = time.monotonic() - self._answered
            if late > WATCHDOG_LATE + WATCHDOG_PERIOD and time.monotonic() - warned_at > 5:
                warned_at = time.monotonic()
                jobs = ", ".join(f"{i} ({w})" for i, w in list(self.running.items())) or "none"
                log.warning("the event loop of async jobs has not answered for %.1f s: a "
                            "blocking call in an async workflow? (jobs on it: %s; their leases "
                            "are kept by the heartbeat)", late, jobs)
            self.loop.call_soon_threadsafe(self._answer)

    def close(self) -> None:
        self._watching.set()

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=5)
            except Exception:  # abandoned tasks that do not stop: the thread is a daemon
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


class ConnPool:
    """The connections jobs use for their own statements (spawn, status notes, tokens) when they
    run in threads of a pool: opened from the engine on first use, at most one per slot."""

    def __init__(self, engine: Engine, pooled: bool = False):
        self.engine = engine
        self.pooled = pooled
        self._idle: queue.SimpleQueue[Conn] = queue.SimpleQueue()
        self._all: list[Conn] = []
        self._lock = threading.Lock()

    def take(self) -> Conn:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            conn = Conn.open(self.engine, pooled=self.pooled)
            with self._lock:
                self._all.append(conn)
        return conn

    def give_back(self, conn: Conn) -> None:
        if conn.closed:
            return
        self._idle.put(conn)

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                close_quietly(conn)
            self._all.clear()


class _JobDb:
    """A job's connection, taken from the pool on first use and given back when the job ends."""

    def __init__(self, pool: ConnPool):
        self.pool = pool
        self.conn: Conn | None = None

    def _conn(self) -> Conn:
        if self.conn is None:
            self.conn = self.pool.take()
        return self.conn

    def rows(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        return self._conn().rows(sql, params)

    def scalar(self, sql: str, params: Any = None) -> Any:
        return self._conn().scalar(sql, params)

    def done(self) -> None:
        if self.conn is not None:
            self.pool.give_back(self.conn)
            self.conn = None


class Slots:
    """Up to ``size`` jobs at once: sync ones in threads of a pool, async ones as tasks.

    A few more jobs than slots (``prefetch``) wait here, checked out already, so that a slot
    that frees up starts its next job at once instead of after a round trip. ``on_done(job,
    outcome)`` is called in the job's thread (or the loop's) when it ends, unless the job was
    abandoned meanwhile (:meth:`abandon`, :meth:`take_unstarted`).
    """

    def __init__(self, size: int, engine: Engine, job_loop: Callable[[], JobLoop],
                 on_done: Callable[[RunningJob, Outcome], None], *,
                 lost: Callable[[int], bool] | None = None, pooled: bool = False,
                 fast_mode: bool = False):
        self.size = size
        self.fast_mode = fast_mode
        self.prefetch = max(1, size // 2)
        self.capacity = size + self.prefetch
        self.pool = ConnPool(engine, pooled)
        self.job_loop = job_loop
        self.on_done = on_done
        self.lost = lost
        self._running: dict[int, tuple[RunningJob, concurrent.futures.Future[Outcome | None] | None]] = {}
        self._started: set[int] = set()  # of _running: those a slot has begun
        self._abandoned: set[int] = set()
        #: the jobs whose code is running now, and the thread of each sync one (None: a task);
        #: unlike _running, abandoning a job does not take it out: its code has to end
        self._executing: dict[int, int | None] = {}
        self._interrupted: set[int] = set()  # threads abandon() raised Abort in
        self._changed = threading.Condition()
        self._work: queue.SimpleQueue[tuple[RunningJob, Workflow[Any, Any]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._semaphore: asyncio.Semaphore | None = None  # made on the loop, for async jobs

    # -- what the worker loop asks ---------------------------------------------------------------

    @property
    def busy(self) -> int:
        """Jobs held: running, or waiting here for a slot."""
        with self._changed:
            return len(self._running)

    @property
    def free(self) -> int:
        """How many more jobs may be handed over now."""
        return self.capacity - self.busy

    def wait(self, free: int, timeout: float) -> None:
        """Until at least ``free`` jobs may be handed over (or none is held), or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.capacity - len(self._running) < free and self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)

    # -- starting and ending jobs ----------------------------------------------------------------

    def start(self, job: RunningJob, wf: Workflow[Any, Any]) -> None:
        """Run ``job`` when a slot is free (at once, if one is)."""
        with self._changed:
            self._running[job.id] = (job, None)
        if wf.is_async:
            loop = self.job_loop()
            loop.running[job.id] = job.workflow
            future = loop.submit(self._run_async(job, wf))
            with self._changed:
                if job.id in self._running:
                    self._running[job.id] = (job, future)
            return
        with self._changed:
            if len(self._threads) < min(self.size, len(self._running)):  # made as needed
                thread = threading.Thread(target=self._thread_main, daemon=True,
                                          name=f"postjob-job-{len(self._threads) + 1}")
                self._threads.append(thread)
                thread.start()
        self._work.put((job, wf))

    def _begin(self, job: RunningJob, thread: int | None) -> bool:
        """A slot takes the job; False if it was abandoned while it waited."""
        with self._changed:
            if job.id in self._abandoned or job.id not in self._running:
                self._abandoned.discard(job.id)
                return False
            self._started.add(job.id)
            self._executing[job.id] = thread
            return True

    def _thread_main(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            job, wf = item
            try:
                self._run_in_thread(job, wf)
            except Abort:  # abandon() interrupted the job as it was ending: it is given up
                self._ended(job, Outcome(job.id, job.lease_token, "release", workflow=job.workflow))

    def _run_in_thread(self, job: RunningJob, wf: Workflow[Any, Any]) -> None:
        if not self._begin(job, threading.get_ident()):
            return
        db = _JobDb(self.pool)
        try:
            outcome = run_job(_RunContext(job, db=db, lost=self.lost, fast_mode=self.fast_mode),
                              wf)
        except BaseException as exc:  # Abort from abandon(), or the like
            outcome = Outcome(job.id, job.lease_token, "release", interrupt=exc,
                              workflow=job.workflow)
        finally:
            db.done()
        self._ended(job, outcome)

    async def _run_async(self, job: RunningJob, wf: Workflow[Any, Any]) -> Outcome | None:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.size)
        try:
            async with self._semaphore:
                if not self._begin(job, None):
                    return None
                db = _JobDb(self.pool)
                try:
                    outcome = await run_job_async(
                        _RunContext(job, db=db, lost=self.lost, fast_mode=self.fast_mode), wf)
                finally:
                    db.done()
        finally:
            self.job_loop().running.pop(job.id, None)
        self._ended(job, outcome)
        return outcome

    def _ended(self, job: RunningJob, outcome: Outcome) -> None:
        with self._changed:
            thread = self._executing.pop(job.id, None)
            if thread is not None and thread in self._interrupted:
                raise_in(thread, None)  # not raised yet: the job has ended, keep the thread
                self._interrupted.discard(thread)
            abandoned = job.id in self._abandoned
            self._abandoned.discard(job.id)
            self._started.discard(job.id)
            self._running.pop(job.id, None)
            self._changed.notify_all()
        if not abandoned:
            self.on_done(job, outcome)

    def take_unstarted(self) -> list[RunningJob]:
        """The jobs still waiting for a slot, taken back (a stop lets only running jobs end)."""
        with self._changed:
            waiting = [job for i, (job, _) in self._running.items() if i not in self._started]
            for job in waiting:
                self._abandoned.add(job.id)
                del self._running[job.id]
            self._changed.notify_all()
        return waiting

    def abandon(self, wait: float = ABANDON_WAIT) -> list[RunningJob]:
        """Give up every job held (a second stop signal): sync ones are interrupted (Abort
        raised in their threads, as a signal would in the main thread), async ones cancelled,
        and their later outcomes dropped. Waits up to ``wait`` seconds for their code to stop
        (its ``finally`` blocks to run), then returns them all, for the caller to hand back.
        A job blocked in a call (a sleep, a socket read) gets the Abort when the call returns:
        no more of its code runs, and its outcome is dropped."""
        with self._changed:
            jobs = [job for job, _ in self._running.values()]
            futures = [f for _, f in self._running.values() if f is not None]
            self._abandoned.update(job.id for job in jobs)
            self._running.clear()
            self._started.clear()
            executing = dict(self._executing)
            for thread in executing.values():
                if thread is not None and thread not in self._interrupted:
                    raise_in(thread, Abort)
                    self._interrupted.add(thread)
            self._changed.notify_all()
        for future in futures:
            future.cancel()
        deadline = time.monotonic() + wait
        with self._changed:
            while (still := [i for i in executing if i in self._executing]):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        if still:
            log.warning("job(s) %s still in a call after %g s: handed back all the same; "
                        "their code stops when the call returns", ", ".join(map(str, still)), wait)
        return jobs

    def close(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        self.pool.close()
