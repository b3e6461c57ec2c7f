"""How a worker runs: the options ``JobQueue`` (and ``postjob run``) build a worker from."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import URL

from postjob_sa._db import worker_identifier
from postjob_sa.worker.wakeup import Waker


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
    #: jobs at once in this worker (threads for sync workflows, tasks for async ones)
    concurrency: int = 1
    #: the engine goes through a pooler in transaction mode: no session state (see wakeup)
    pooled: bool = False
    #: a direct URL to LISTEN on when pooled (else the worker polls every poll_interval)
    wakeup_url: URL | None = None
    poll_interval: float = 1.0
    #: what wakes the worker (None: chosen from the options above, see choose_waker)
    waker: Waker | None = None
