"""AsyncJobQueue: the JobQueue operations for an ``AsyncSession``.

Each operation is ``JobQueue``'s own, run on the session's underlying ``Session`` through
``AsyncSession.run_sync`` (SQLAlchemy's bridge from async to sync code): the same statements,
the same validation and errors, inside the caller's transaction, never committed. The worker
entry points run the worker in a thread (it owns its connections: sync ones, made from the
async engine's URL unless ``worker_engine`` is given) while the caller's event loop goes on.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_scoped_session
from sqlalchemy.orm import Session
from typing_extensions import Unpack

from postjob_sa._db import check_session_driver
from postjob_sa._sync_url import SYNC_DRIVERNAME, sync_url
from postjob_sa.errors import InvalidArgument
from postjob_sa.models import Job
from postjob_sa.queue import JobQueue
from postjob_sa.registry import Registry
from postjob_sa.worker.loop import Worker
from postjob_sa.worker.options import WorkerOptions, WorkerSettings, worker_options

P = ParamSpec("P")
R = TypeVar("R")


class _SyncSide(JobQueue):
    """The JobQueue on an AsyncSession's underlying Session: its statements run through the
    async driver (psycopg 3's or asyncpg), which a plain JobQueue refuses."""

    def _check_bind(self, engine: Engine) -> None:
        check_session_driver(engine)

    @property
    def _called_as(self) -> str:
        return "AsyncJobQueue"


def _forward(method: Callable[Concatenate[JobQueue, P], R]) -> Callable[Concatenate[AsyncJobQueue, P], Awaitable[R]]:
    """``JobQueue.method``, awaitable, on the async session's underlying Session."""

    async def call(queue: AsyncJobQueue, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await queue.session.run_sync(lambda s: method(queue._queue(s), *args, **kwargs))

    call.__name__ = method.__name__
    call.__qualname__ = f"AsyncJobQueue.{method.__name__}"
    call.__doc__ = method.__doc__
    return call


class AsyncJobQueue:
    """The job queue, bound to a SQLAlchemy ``AsyncSession`` (psycopg 3's async driver,
    ``postgresql+psycopg://``, or asyncpg): the operations of :class:`~postjob_sa.JobQueue`,
    awaitable, with the same arguments, validation and errors.

    ``worker_engine`` is a sync Engine the worker entry points (``step``, ``drain``,
    ``work``) take their connections from; by default one is made from the session's URL
    (with psycopg 3). ``session`` may be an ``async_scoped_session``: each call joins the
    transaction of its current AsyncSession. ``job_context`` is as for ``JobQueue``.
    """

    def __init__(
        self,
        session: AsyncSession | async_scoped_session[Any],
        fast_mode: bool = False,
        *,
        registry: Registry | None = None,
        job_context: Callable[[], AbstractContextManager[Any]] | None = None,
        worker_engine: Engine | None = None,
        options: WorkerOptions | None = None,
        **settings: Unpack[WorkerSettings],
    ):
        self._session: AsyncSession | None = None
        self._scoped: async_scoped_session[Any] | None = None
        if isinstance(session, async_scoped_session):
            self._scoped = session  # resolved at each call: the current AsyncSession
        elif isinstance(session, AsyncSession):
            self._session = session
        else:
            raise InvalidArgument(
                "AsyncJobQueue needs a SQLAlchemy AsyncSession or async_scoped_session, e.g. "
                f"AsyncJobQueue(AsyncSession(async_engine)), not {session!r}"
            )
        self.worker_engine = worker_engine
        self.options = worker_options(options, fast_mode, settings)  # checked once, here
        self._registry, self._job_context = registry, job_context
        self._template = self._queue(self._session.sync_session if self._session else Session())

    @property
    def session(self) -> AsyncSession:
        """The AsyncSession the queue's operations join: the one it was given, or the current
        one of the ``async_scoped_session`` it was given."""
        if self._scoped is not None:
            current: AsyncSession = self._scoped()
            return current
        assert self._session is not None
        return self._session

    def _queue(self, session: Session) -> JobQueue:
        return _SyncSide(session, registry=self._registry, job_context=self._job_context,
                         options=self.options)

    enqueue = _forward(JobQueue.enqueue)
    enqueue_many = _forward(JobQueue.enqueue_many)
    checkout = _forward(JobQueue.checkout)
    resolve = _forward(JobQueue.resolve)
    reset = _forward(JobQueue.reset)
    force = _forward(JobQueue.force)
    reap = _forward(JobQueue.reap)
    cancel = _forward(JobQueue.cancel)
    emit_event = _forward(JobQueue.emit_event)
    set_queue_limits = _forward(JobQueue.set_queue_limits)
    queue_limits = _forward(JobQueue.queue_limits)

    async def complete(self, job: Job, result: Any = None) -> None:
        """Record a checked-out job's result (in the caller's transaction); the job's
        attributes are loaded again (an expired attribute cannot load by itself in async code)."""
        await self.session.run_sync(lambda s: self._queue(s).complete(job, result))
        await self.session.refresh(job)

    async def fail(self, job: Job, error: BaseException, *, retry: bool = True) -> None:
        """Record a failed run of a checked-out job: retried with back-off when ``retry``."""
        await self.session.run_sync(lambda s: self._queue(s).fail(job, error, retry=retry))
        await self.session.refresh(job)

    # -- worker entry points: the worker runs in a thread of its own -------------------------------

    def _engine(self) -> tuple[Engine, bool]:
        """The worker's engine, and whether it is ours to dispose."""
        if self.worker_engine is not None:
            return self.worker_engine, False
        bind = self.session.bind
        if isinstance(bind, AsyncConnection):
            bind = bind.engine
        if not isinstance(bind, AsyncEngine):
            raise InvalidArgument("AsyncJobQueue's session must be bound to an AsyncEngine, or "
                                  "pass worker_engine=")
        # the worker's connections are sync ones: psycopg 3, whatever the async driver
        return create_engine(sync_url(bind.url).set(drivername=SYNC_DRIVERNAME)), True

    async def _run(self, *, handle_signals: bool = False, **options: Any) -> int:
        engine, ours = self._engine()
        worker = self._template._worker_on(engine, **options)
        loop = asyncio.get_running_loop()
        installed = _stop_on_signals(loop, worker) if handle_signals else []
        future = loop.run_in_executor(None, worker.run)
        try:
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                worker.stopper.request("the task running the worker was cancelled")
                await _worker_ended(future, worker)  # the running jobs end first
                raise
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            if ours:
                engine.dispose()

    async def step(self, transactional: bool = False) -> int | None:
        """Check out, run and record one job (see ``JobQueue.step``)."""
        engine, ours = self._engine()
        try:
            worker = self._template._worker_on(engine, count=1, until_idle=True,
                                               handle_signals=False, transactional=transactional)
            done = await asyncio.get_running_loop().run_in_executor(None, worker.run)
            return worker.last_recorded if done else None
        finally:
            if ours:
                engine.dispose()

    async def drain(self, *, queues: Iterable[str] | None = None) -> int:
        """Run jobs until none is runnable now; return how many runs were recorded."""
        return await self._run(batch=self.options.batch, until_idle=True,
                               queues=list(queues) if queues is not None else None,
                               concurrency=self.options.concurrency)

    async def work(
        self,
        count: int | None = None,
        *,
        queues: Iterable[str] | None = None,
        workflows: Iterable[str] | None = None,
        handle_signals: bool = True,
    ) -> int:
        """The worker loop (see ``JobQueue.work``), awaitable. In the main thread, SIGINT and
        SIGTERM stop it (running jobs end first; a second signal hands them back); cancelling
        the awaiting task stops it the same way (a second cancel hands them back), and the
        task ends only once the worker has stopped: nothing of it runs on after this returns."""
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise InvalidArgument(f"count must be a positive integer, not {count!r}")
        return await self._run(
            handle_signals=handle_signals, count=count, batch=self.options.batch,
            queues=list(queues) if queues is not None else None,
            workflows=list(workflows) if workflows is not None else None,
            concurrency=self.options.concurrency,
        )


async def _worker_ended(future: asyncio.Future[int], worker: Worker) -> None:
    """Until the worker's thread has ended. A further cancel hands the running jobs back
    (their code is interrupted); it does not stop the wait: nothing of the worker may go on
    running once ``work()`` has returned."""
    while True:
        try:
            await asyncio.shield(future)
            return
        except asyncio.CancelledError:
            if future.done():
                raise
            worker.stopper.abort("the task running the worker was cancelled again")


def _stop_on_signals(loop: asyncio.AbstractEventLoop, worker: Worker) -> list[signal.Signals]:
    """The loop's SIGINT/SIGTERM handlers stop the worker (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return []
    sigs = [signal.SIGINT, signal.SIGTERM]
    for sig in sigs:
        loop.add_signal_handler(sig, worker.stopper.signalled, sig)
    return sigs
