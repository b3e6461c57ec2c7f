"""JobQueue: the Session-bound API. It joins the caller's transaction and never commits it.

The worker loops ``step``/``drain``/``work`` are thin entry points: they build a worker from the
session's engine, this queue's registry and options; the worker owns its connections and never
touches the session or what the caller has pending in it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Never

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session, make_transient_to_detached, scoped_session
from typing_extensions import Unpack

from postjob_sa import _backoff, _metrics, _session_sql, _tracing, _validate
from postjob_sa._db import check_driver
from postjob_sa._enqueue_args import job_options, workflow_name
from postjob_sa._migrations import schema_checked
from postjob_sa._operations import JobOperations
from postjob_sa.errors import InvalidArgument, InvalidJobState
from postjob_sa.models import Job, Status
from postjob_sa.registry import Registry, Workflow, default_registry
from postjob_sa.worker import pooler
from postjob_sa.worker.executor import MAX_MESSAGE_CHARS, Outcome, error_name, outcome_params
from postjob_sa.worker.loop import Worker
from postjob_sa.worker.options import (
    OptionOf,
    WorkerOptions,
    WorkerSettings,
    worker_options,
)

#: An enqueue with a unique key inserts again when the key's holder finished meanwhile.
ENQUEUE_TRIES = 5


class JobQueue(JobOperations):
    """The job queue, bound to a SQLAlchemy Session.

    The keywords after ``session`` configure the workers this queue builds (``step``,
    ``drain``, ``work``), as the fields of :class:`~postjob_sa.worker.options.WorkerOptions`
    of the same name say (``batch_size`` is its ``batch``), or ``options=`` gives them whole:
    ``fast_mode`` shortens retry back-off to 0.01 s·1.5^n (tests); ``lease`` is how long a
    checked-out job is held before it is presumed abandoned (the worker's heartbeat extends
    it while the job runs); ``batch_size`` is how many jobs a worker checks out per round trip;
    ``concurrency`` is how many jobs a worker runs at once (sync workflows in threads, async
    ones as tasks on an event loop of the worker's; each keeps its own lease).

    ``pooled=True`` is for a session's engine that goes through a pooler in transaction mode
    (PgBouncer): the worker keeps nothing in its connections' sessions (no LISTEN, no
    server-side prepared statements, no session settings). It then LISTENs on a direct
    connection to ``wakeup_url`` if given, and otherwise looks at the queue every
    ``poll_interval`` seconds (see docs/operations.md). By default (None) the first worker
    built on an engine finds out, and one warning says so when it finds a pooler;
    ``pooled=False`` skips that check.

    ``session`` may be a ``scoped_session`` (Flask-SQLAlchemy's ``db.session``): each call
    joins the transaction of its current Session. ``job_context`` is entered around every run
    of a job by this queue's workers (``step``, ``drain``, ``work``), e.g. a Flask app's
    ``app.app_context``: workflows then use ``db.session``, ``current_app`` and the config.
    """

    lease = OptionOf("lease")
    batch_size = OptionOf("batch")
    fast_mode = OptionOf("fast_mode")
    identifier = OptionOf("identifier")
    concurrency = OptionOf("concurrency")
    pooled = OptionOf("pooled")
    wakeup_url = OptionOf("wakeup_url")
    poll_interval = OptionOf("poll_interval")

    def __init__(
        self,
        session: Session | scoped_session[Any],
        fast_mode: bool = False,
        *,
        registry: Registry | None = None,
        job_context: Callable[[], AbstractContextManager[Any]] | None = None,
        options: WorkerOptions | None = None,
        **settings: Unpack[WorkerSettings],
    ):
        self._session: Session | None = None
        self._scoped: scoped_session[Any] | None = None
        if isinstance(session, scoped_session):
            # resolved at each call: the current session of the request (Flask-SQLAlchemy's
            # db.session), created outside one only when a statement runs
            self._scoped = session
        elif isinstance(session, Session):
            if session.bind is not None:  # else it is checked where a statement would run
                self._check_bind(session.bind.engine)
            self._session = session
        else:
            raise InvalidArgument(
                "JobQueue needs a SQLAlchemy Session or scoped_session (Flask-SQLAlchemy's "
                f"db.session), e.g. JobQueue(Session(engine)), not {session!r}"
            )
        if job_context is not None and not callable(job_context):
            raise InvalidArgument("job_context must be a callable that returns a context manager "
                                  f"(e.g. app.app_context), not {job_context!r}")
        self.job_context = job_context
        self.options = worker_options(options, fast_mode, settings)
        self.registry = registry or default_registry

    @property
    def session(self) -> Session:
        """The Session the queue's operations join: the one it was given, or the current one
        of the ``scoped_session`` it was given."""
        if self._scoped is not None:
            current: Session = self._scoped()
            return current
        assert self._session is not None
        return self._session

    @property
    def engine(self) -> Engine:
        """The engine the session is bound to (workers take their connections from it)."""
        engine = self._checked_engine()
        check_driver(engine)
        return engine

    def _checked_engine(self) -> Engine:
        bind = self.session.get_bind(Job)
        engine = bind.engine if isinstance(bind, Connection) else bind
        assert isinstance(engine, Engine)
        self._check_bind(engine)
        return engine

    @property
    def _called_as(self) -> str:
        """The class the caller used, as errors name it (AsyncJobQueue's queue: AsyncJobQueue)."""
        return type(self).__name__

    def _check_bind(self, engine: Engine) -> None:
        """A driver the queue's statements run on (AsyncJobQueue's queue allows async ones)."""
        check_driver(engine)

    def _worker(self, **options: Any) -> Worker:
        return self._worker_on(self.engine, **options)

    def _worker_on(self, engine: Engine, **options: Any) -> Worker:
        check_driver(engine)
        opts = self.options.but(**options)
        if opts.pooled is None:  # found out once per worker, before it connects
            opts = opts.but(pooled=pooler.pooled(engine, opts.wakeup_url, opts.poll_interval))
        registry = self.registry
        if self.job_context is not None:  # every run enters it (see Workflow.job_context)
            registry = registry.with_job_context(self.job_context)
        return Worker(engine, registry, opts)

    # -- enqueue -----------------------------------------------------------------------------

    @schema_checked
    def enqueue(
        self, /,
        workflow_or_name: Workflow[Any, Any] | str,
        *args: Any,
        queue: str | None = None,
        parent_id: int | None = None,
        tags: Mapping[str, Any] | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        version: str | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        unique_key: str | None = None,
        **keywords: Never,
    ) -> Job:
        """Add a job to the caller's transaction (flushed, not committed) and return it.

        Checkout takes higher ``priority`` first (then the earliest due). While an unfinished
        job holds ``unique_key``, that job is returned instead of a new one (race-free: a
        unique index decides). With ``parent_id``, a child that this parent already has (same
        workflow and args) is returned instead of a second one, as ``spawn`` does. The
        workflow's ``args`` are positional: a keyword that is not an option is refused."""
        if keywords:
            raise _validate.keywords_refused(f"{self._called_as}.enqueue", JobQueue.enqueue, keywords)
        self._checked_engine()  # a driver of ours (InvalidArgument) before anything is written
        name, wf = workflow_name(workflow_or_name)
        args_json = _validate.args_json(args)
        opts = job_options(wf, queue, max_attempts, timeout, version, tags, run_at)
        self.registry.check_args(wf or name, version, [args])  # where the function is here
        params = {
            "workflow": name, "args": args_json, "queue": opts["queue"],
            "max_attempts": opts["max_attempts"], "timeout": opts["timeout"],
            "version": opts["workflow_version"], "tags": opts["tags"],
            "parent_id": parent_id, "run_at": opts["run_at"],
            "priority": _validate.priority(priority),
            "unique_key": None if unique_key is None else _validate.name(unique_key, "unique_key"),
            "trace_context": _tracing.current_context(),
        }
        conn = self.session.connection()
        if parent_id is not None:
            self._require_job(_validate.job_id(parent_id))
            conn.execute(_session_sql.JOB_CHILDREN_LOCK, params)
        for _ in range(ENQUEUE_TRIES):
            if parent_id is None:
                job_id: int | None = conn.execute(_session_sql.JOB_ENQUEUE, params).scalar()
                ids: tuple[int | None, str | None] = (job_id, str(job_id))
            else:
                row = conn.execute(_session_sql.JOB_ENQUEUE_CHILD, params).first()
                job_id = None if row is None else row.id
                ids = (None, None) if row is None else (row.root_id, row.full_id)
            if job_id is not None:
                break
            existing = self._existing(params)
            if existing is not None:  # the holder of the key, or this parent's child
                found = self.session.get(Job, existing)
                assert found is not None
                return found
            # the holder of the key finished between the two statements: insert again
        else:
            raise InvalidJobState(f"unique key {unique_key!r} is taken and released too often")
        # A persistent Job without another query: what the caller is likely to read is set,
        # the rest (timestamps, ...) loads on first access.
        job = Job._as_written({
            "id": job_id, "parent_id": parent_id, "root_id": ids[0], "full_id": ids[1],
            "workflow": name, "args": json.loads(args_json), "queue": opts["queue"],
            "recorded_status": Status.ready, "workflow_version": opts["workflow_version"],
            "max_attempts": opts["max_attempts"], "priority": params["priority"],
            "unique_key": params["unique_key"],
            "unfinished": None,  # not running: no need to load its row
        })
        make_transient_to_detached(job)
        self.session.add(job)
        _metrics.enqueued(name, opts["queue"])
        return job

    def _existing(self, params: dict[str, Any]) -> int | None:
        conn = self.session.connection()
        if params["unique_key"] is not None:
            holder = conn.execute(_session_sql.JOB_BY_UNIQUE_KEY, params).scalar()
            if holder is not None:
                return int(holder)
        if params["parent_id"] is not None:
            child = conn.execute(_session_sql.JOB_CHILD_BY_KEY, params).scalar()
            if child is not None:
                return int(child)
        return None

    @schema_checked
    def enqueue_many(
        self, /,
        workflow_or_name: Workflow[Any, Any] | str,
        arg_lists: Iterable[Sequence[Any]],
        *,
        queue: str | None = None,
        tags: Mapping[str, Any] | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        version: str | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        **keywords: Never,
    ) -> list[int]:
        """Add one root job per args list in one statement; return their ids in order."""
        if keywords:
            raise _validate.keywords_refused(f"{self._called_as}.enqueue_many", JobQueue.enqueue_many,
                                   keywords)
        self._checked_engine()  # a driver of ours (InvalidArgument) before anything is written
        name, wf = workflow_name(workflow_or_name)
        arg_lists = list(arg_lists)
        encoded, count = _validate.args_json_many(arg_lists)
        if not count:
            return []
        opts = job_options(wf, queue, max_attempts, timeout, version, tags, run_at)
        self.registry.check_args(wf or name, version, arg_lists, numbered=True)
        rows = self.session.execute(
            _session_sql.JOB_ENQUEUE_MANY,
            {
                "workflow": name,
                "args": encoded,
                "queue": opts["queue"],
                "max_attempts": opts["max_attempts"],
                "timeout": opts["timeout"],
                "version": opts["workflow_version"],
                "tags": opts["tags"],
                "run_at": opts["run_at"],
                "priority": _validate.priority(priority),
                "trace_context": _tracing.current_context(),
            },
        )
        ids = [r[0] for r in rows]
        _metrics.enqueued(name, opts["queue"], len(ids))
        return ids

    # -- checkout in the caller's transaction ------------------------------------------------

    @schema_checked
    def checkout(
        self,
        workflows: Iterable[str] | None = None,
        limit: int = 1,
        queues: Iterable[str] | None = None,
    ) -> list[Job]:
        """Check out up to ``limit`` runnable jobs (FOR UPDATE SKIP LOCKED) in the caller's
        transaction; a rollback returns them (idle workers take them at their next wake-up, or
        within 30 s: a rollback notifies no one). Record outcomes with complete()/fail().

        It locks only the jobs it hands out: it makes no job due (the workers do), but takes
        the jobs whose time has come anyway; reaping is the workers' and ``reap()``'s job."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidArgument(f"limit must be an integer from 1 to 10000, not {limit!r}")
        names, versions = self.registry.pairs(list(workflows) if workflows is not None else None)
        params = {
            "worker_id": None, "identifier": self.identifier,
            "workflows": names, "versions": versions,
            "queues": [_validate.name(q, "queue") for q in queues] if queues is not None else None,
            "limit": limit, "lease": self.lease,
        }
        ids = list(self.session.execute(_session_sql.JOB_CHECKOUT, params).scalars())
        if not ids:
            return []
        # the jobs as the checkout left them (its own columns are a running job's, not a row)
        stmt = select(Job).where(Job.id.in_(ids)).execution_options(populate_existing=True)
        jobs = {job.id: job for job in self.session.scalars(stmt)}
        return [jobs[i] for i in ids]

    def _finish(self, outcome: Outcome) -> None:
        rows = self.session.execute(_session_sql.JOB_FINISH,
                                    outcome_params([outcome], literals=False)).all()
        if any(kind == "lost" for kind, _ in rows):
            raise InvalidJobState(f"job {outcome.job_id} is not checked out under this lease")

    @schema_checked
    def complete(self, job: Job, result: Any = None) -> None:
        """Record a checked-out job's result (in the caller's transaction)."""
        payload = _validate.to_json([result], "result")
        self._finish(Outcome(job.id, job.lease_token, "ok", result=payload, version=job.workflow_version))
        self.session.expire(job)

    @schema_checked
    def fail(self, job: Job, error: BaseException, *, retry: bool = True) -> None:
        """Record a failed run of a checked-out job: retried with back-off when ``retry``."""
        if not isinstance(error, BaseException):
            raise InvalidArgument(f"error must be an exception, not {error!r}")
        message = _validate.text(str(error)[:MAX_MESSAGE_CHARS], "the error message")
        wf = self.registry.get(job.workflow)
        self._finish(
            Outcome(
                job.id, job.lease_token, "err" if retry else "failed",
                error=_validate.text(error_name(error), "the error class"), message=message,
                version=job.workflow_version,
                retry_in=_backoff.delay(wf.backoff if wf else None, job.failed_attempts + 1,
                                        fast=self.fast_mode, workflow=job.workflow)
                if retry else None,
            )
        )
        self.session.expire(job)

    # -- worker loops ------------------------------------------------------------------------

    def step(self, transactional: bool = False) -> int | None:
        """Check out, run and record one job; return its id, or None if none was runnable
        (or its outcome was not recorded: see the log).

        With ``transactional=True`` the job runs in a transaction of the worker's, and its
        workflow gets a Session joined to it: its writes and its completion commit together.
        The queue's own session is not touched."""
        worker = self._worker(count=1, until_idle=True, handle_signals=False,
                              transactional=transactional)
        return worker.last_recorded if worker.run() else None

    def drain(self, *, queues: Iterable[str] | None = None) -> int:
        """Run jobs until none is runnable now; return how many runs were recorded. Jobs
        enqueued in this queue's session run only once the session has committed them."""
        return self._worker(
            batch=self.batch_size, until_idle=True, handle_signals=False,
            queues=list(queues) if queues is not None else None, concurrency=self.concurrency,
        ).run()

    def work(
        self,
        count: int | None = None,
        *,
        queues: Iterable[str] | None = None,
        workflows: Iterable[str] | None = None,
    ) -> int:
        """The worker loop: run jobs as they become due, sleep on LISTEN in between; stop
        after ``count`` jobs or on SIGINT/SIGTERM (after the current job; a second signal
        stops at once and releases the job). Returns how many runs were recorded."""
        return self._worker(
            count=count, batch=self.batch_size,
            queues=list(queues) if queues is not None else None,
            workflows=list(workflows) if workflows is not None else None,
            concurrency=self.concurrency,
        ).run()
