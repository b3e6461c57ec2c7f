"""How a worker runs: one validated configuration, which ``JobQueue``, ``AsyncJobQueue`` and
``postjob run`` build their workers from."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from sqlalchemy import URL
from typing_extensions import Unpack

from postjob_sa import _validate
from postjob_sa._db import worker_identifier
from postjob_sa.errors import InvalidArgument
from postjob_sa.worker.wakeup import Waker, wakeup_url_of

DEFAULT_LEASE = 60.0
MAX_BATCH = 10_000
MAX_CONCURRENCY = 1000


class WorkerSettings(TypedDict, total=False):
    """The keywords ``JobQueue(...)`` and ``AsyncJobQueue(...)`` take for their workers (the
    fields of :class:`WorkerOptions` of the same meaning; ``batch_size`` is ``batch``)."""

    lease: float
    batch_size: int
    identifier: str | None
    concurrency: int
    pooled: bool | None
    wakeup_url: str | URL | None
    poll_interval: float


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs. Every value is checked when the options are made
    (:class:`~postjob_sa.InvalidArgument`), so a worker never starts on a bad one."""

    #: seconds a checked-out job is held before it is presumed abandoned (the heartbeat
    #: extends it while the job runs)
    lease: float = DEFAULT_LEASE
    #: jobs checked out per round trip
    batch: int = 1
    #: retry back-off of 0.01 s·1.5^n (tests, demos)
    fast_mode: bool = False
    #: how the worker is named in ``ps``, the dashboard and ``pg_stat_activity``
    identifier: str = field(default_factory=worker_identifier)
    queues: list[str] | None = None
    workflows: list[str] | None = None
    #: stop after this many jobs
    count: int | None = None
    #: stop once nothing is runnable now (``drain``, ``step``)
    until_idle: bool = False
    handle_signals: bool = True
    #: run every job in transactional mode (``JobQueue.step(transactional=True)``)
    transactional: bool = False
    #: jobs at once in this worker (threads for sync workflows, tasks for async ones)
    concurrency: int = 1
    #: the engine goes through a pooler in transaction mode: nothing kept in its sessions
    #: (None: found out by a probe when the worker is built)
    pooled: bool | None = None
    #: a direct URL to LISTEN on when pooled (else the worker polls every poll_interval)
    wakeup_url: URL | None = None
    poll_interval: float = 1.0
    #: what wakes the worker (None: chosen from the options above, see choose_waker)
    waker: Waker | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the checked values are stored once, here
        set_(self, "lease", _validate.seconds(self.lease, "lease") or DEFAULT_LEASE)
        _bounded_int(self.batch, "batch_size", MAX_BATCH)
        _bounded_int(self.concurrency, "concurrency", MAX_CONCURRENCY)
        if self.count is not None and (isinstance(self.count, bool)
                                       or not isinstance(self.count, int) or self.count < 1):
            raise InvalidArgument(f"count must be a positive integer, not {self.count!r}")
        set_(self, "poll_interval", _validate.seconds(self.poll_interval, "poll_interval") or 1.0)
        if self.wakeup_url is not None:
            set_(self, "wakeup_url", wakeup_url_of(self.wakeup_url))
        set_(self, "fast_mode", bool(self.fast_mode))
        if self.pooled is not None:
            set_(self, "pooled", bool(self.pooled))
        if not isinstance(self.identifier, str) or not self.identifier:
            raise InvalidArgument(f"identifier must be a non-empty string, not {self.identifier!r}")

    @classmethod
    def of(cls, fast_mode: bool = False, **settings: Unpack[WorkerSettings]) -> WorkerOptions:
        """The options of a queue's keywords (``JobQueue(session, lease=30, batch_size=10)``)."""
        unknown = set(settings) - set(WorkerSettings.__annotations__)
        if unknown:
            raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
        given: dict[str, Any] = {k: v for k, v in settings.items() if v is not None or k == "pooled"}
        if "batch_size" in given:
            given["batch"] = given.pop("batch_size")
        return cls(fast_mode=fast_mode, **given)

    def but(self, **changes: Any) -> WorkerOptions:
        """These options with some changed (checked again)."""
        return replace(self, **changes)


def worker_options(options: WorkerOptions | None, fast_mode: bool,
                   settings: WorkerSettings) -> WorkerOptions:
    """A queue's worker options: ``options=`` as given, or made of its keywords (not both)."""
    if options is None:
        return WorkerOptions.of(fast_mode, **settings)
    if not isinstance(options, WorkerOptions):
        raise InvalidArgument(f"options must be WorkerOptions, not {options!r}")
    if settings or fast_mode:
        raise InvalidArgument("give the worker's options as options= or as keywords, not both")
    return options


class OptionOf:
    """A queue's attribute that reads its worker options (``queue.lease``, ``queue.batch_size``:
    public names of the keywords it was made with)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, queue: Any, owner: type | None = None) -> Any:
        if queue is None:
            return self
        return getattr(queue.options, self.name)


def _bounded_int(value: object, what: str, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidArgument(f"{what} must be an integer from 1 to {maximum}, not {value!r}")
