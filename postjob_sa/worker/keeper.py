"""The worker's membership: its row in ``postjob.workers``, its heartbeat, and outcomes that must
not wait.

While the worker loop is free it beats itself (:meth:`Keeper.beat_if_due`, on the loop's own
connection), so an idle worker, or one running short jobs, uses one connection. Two background
duties cover the time the loop is busy in a job, each on a connection of its own opened the first
time it is needed: the heartbeat steps in when a beat is late, and the flusher records the
outcomes of jobs that ended more than :data:`FLUSH_DELAY` ago (a quick job's outcome is not held
back by the slow job after it in the same batch). They are apart because recording an outcome can
wait for a row lock that another transaction holds, and a heartbeat must never wait: it updates
only the worker's own row and extends the leases of the job rows it can lock at once.

A job whose worker beats is never reaped; a worker whose heartbeat could not reach the database
for a whole lease is presumed dead, its jobs are rescued, and the keeper reports them as lost. A
worker whose connection is direct says which one is its own (:meth:`Keeper.attach`): once that
connection is gone (the process died), its jobs are rescued at the next reap.

Duties of other modules start and stop with these (``companions``: the upkeep of the hot
tables, ``postjob_sa.worker.upkeep``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from sqlalchemy import Engine

from postjob_sa import _sql
from postjob_sa._db import Conn, close_quietly
from postjob_sa._migrations import schema_error
from postjob_sa.worker.held import HeldJobs
from postjob_sa.worker.recorder import Recorder

log = logging.getLogger("postjob_sa.worker")

#: The longest an ended job's outcome waits while the loop is busy with another job.
FLUSH_DELAY = 0.1
#: After a failed attempt, a duty waits this long before the next.
RETRY_DELAY = 0.5


class _Duty:
    """A daemon thread that acts when ``due_in()`` reaches zero, on a connection of its own."""

    def __init__(self, name: str, engine: Engine, app_name: str,
                 due_in: Callable[[], float], act: Callable[[Conn], None], pooled: bool):
        self.name = name
        self.engine = engine
        self.app_name = app_name
        self.pooled = pooled
        self.due_in = due_in
        self.act = act
        self._wake = threading.Condition()
        self._stopping = False
        self._pause_until = 0.0
        self._conn: Conn | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def nudge(self) -> None:
        with self._wake:
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        close_quietly(self._conn)
        self._conn = None

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
                pause = self._pause_until - time.monotonic()
                self._wake.wait(timeout=min(5.0, max(0.005, self.due_in(), pause)))
                if self._stopping:
                    return
            if self.due_in() > 0 or time.monotonic() < self._pause_until:
                continue
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = Conn.open(self.engine, name=self.app_name, pooled=self.pooled)
                self.act(self._conn)
            except Exception as exc:
                log.warning("%s: %s (trying again)", self.name, " ".join(str(exc).split())[:300])
                close_quietly(self._conn)
                self._conn = None
                self._pause_until = time.monotonic() + RETRY_DELAY


class Companion(Protocol):
    """A duty of another module that starts and stops with the keeper's (the upkeep's)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class Keeper:
    """Registration, heartbeat and background flushes of one worker."""

    def __init__(self, engine: Engine, recorder: Recorder, *, lease: float, identifier: str,
                 revision: str, workflows: list[str], queues: list[str] | None,
                 versions: list[str] | None = None, pooled: bool = False,
                 companions: Sequence[Companion] = ()):
        self.engine = engine
        self.recorder = recorder
        self.held: HeldJobs = recorder.held
        self.lease = lease
        self.interval = lease / 3.0
        self.identifier = identifier
        self._registration = {"identifier": identifier, "lease": lease, "revision": revision,
                              "workflows": workflows, "versions": versions, "queues": queues}
        self.worker_id: int | None = None
        self.pooled = pooled
        # the connection (and worker id) the database knows as the worker's own (attach)
        self._attached: tuple[Conn | None, int | None] = (None, None)
        self._beat_lock = threading.Lock()  # one beat at a time
        self._next_beat = float("inf")
        # the loop beats on time when it is free; the heartbeat duty steps in when it is late
        slack = min(1.0, self.interval / 4)
        self._heartbeat = _Duty("postjob-heartbeat", engine, f"postjob heartbeat {identifier}",
                                lambda: self._next_beat + slack - time.monotonic(), self.beat,
                                pooled)
        self._flusher = _Duty("postjob-flusher", engine, f"postjob flusher {identifier}",
                              self._flush_due_in, self._flush_aged, pooled)
        self.companions = list(companions)

    # -- membership ----------------------------------------------------------------------------

    def register(self, conn: Conn) -> None:
        self.worker_id = int(conn.scalar(_sql.WORKER_REGISTER, self._registration))
        self._next_beat = time.monotonic() + self.interval

    def attach(self, conn: Conn) -> None:
        """``conn`` is the worker's own connection (its loop's): when it is direct, the
        database presumes the worker dead as soon as that connection is gone, and rescues its
        jobs then rather than at the end of their lease. Said once per connection and id."""
        if self.pooled or self.worker_id is None:
            return  # behind a pooler the server's process is not the worker's: leases alone
        if self._attached[0] is conn and self._attached[1] == self.worker_id:
            return
        conn.scalar(_sql.WORKER_ATTACH, {"worker_id": self.worker_id})
        self._attached = (conn, self.worker_id)

    def unregister(self, conn: Conn | None) -> None:
        if self.worker_id is None or conn is None or conn.closed:
            return  # the row expires by itself
        try:
            conn.scalar(_sql.WORKER_UNREGISTER, {"worker_id": self.worker_id})
        except Exception as exc:
            if schema_error(exc) is None:  # with the schema gone there is no row to remove
                log.warning("could not unregister the worker (its row expires by itself): %s",
                            " ".join(str(exc).split()))
        self.worker_id = None

    # -- the jobs held (the book is the recorder's: recording a job's outcome releases it) -------

    def hold(self, leases: Iterable[tuple[int, int]]) -> None:
        self.held.hold(leases)

    def release(self, ids: Iterable[int]) -> None:
        self.held.release(ids)

    def stop(self, ids: Iterable[int]) -> None:
        """These runs stopped with no outcome to record (their jobs ended from outside)."""
        self.held.stop(ids)
        self.nudge()

    def is_lost(self, job_id: int) -> bool:
        """Whether a heartbeat found this job no longer ours (cancelled, reaped, reset)."""
        return self.held.is_lost(job_id)

    # -- beating -------------------------------------------------------------------------------

    def seconds_to_beat(self) -> float:
        return max(0.0, self._next_beat - time.monotonic())

    def beat_if_due(self, conn: Conn) -> None:
        if time.monotonic() >= self._next_beat:
            self.beat(conn)

    def beat(self, conn: Conn) -> None:
        """Keep the worker alive and extend the leases of its jobs; note those it lost."""
        with self._beat_lock:
            held = self.held.snapshot()
            lost = conn.scalar(_sql.WORKER_HEARTBEAT, {
                "worker_id": self.worker_id, "lease": self.lease,
                "ids": list(held), "leases": list(held.values()),
            })
            self._next_beat = time.monotonic() + self.interval
            if lost is None:
                log.error("this worker was presumed dead (no heartbeat for a whole lease): its "
                          "jobs were rescued by others; registering again")
                self.register(conn)
                lost = list(held)
            if lost:
                fresh = self.held.mark_lost(lost)
                if fresh:
                    log.warning("jobs %s lost their lease (reaped, reset or resolved meanwhile): "
                                "their outcomes will not be recorded", ", ".join(map(str, fresh)))

    # -- the background duties -----------------------------------------------------------------

    def start(self) -> None:
        self._heartbeat.start()
        self._flusher.start()
        for companion in self.companions:
            companion.start()

    def nudge(self) -> None:
        """An outcome was buffered: make sure it is recorded within FLUSH_DELAY."""
        self._flusher.nudge()

    def halt(self) -> None:
        """Stop the background duties."""
        for companion in self.companions:
            companion.stop()
        self._flusher.stop()
        self._heartbeat.stop()

    def _flush_due_in(self) -> float:
        age = self.recorder.age()
        if age is None:
            return 0.0 if self.held.has_stopped else float("inf")
        return FLUSH_DELAY - age

    def _flush_aged(self, conn: Conn) -> None:
        outcomes = self.recorder.take()
        if outcomes or self.held.has_stopped:
            self.recorder.cycle(conn, outcomes, None, self.worker_id)
