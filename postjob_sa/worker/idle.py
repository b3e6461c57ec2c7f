"""An idle worker: when it reaps, how long it waits, and what wakes it.

The worker asks :class:`Idle` two things: whether a checkout should reap expired leases and
deadlines now (a busy worker does at most every ``REAP_INTERVAL``), and to wait until there may
be work (a wake-up, the next due job, the next heartbeat or schedule tick, a signal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from postjob_sa import _sql
from postjob_sa._db import Conn
from postjob_sa.worker import rescues
from postjob_sa.worker.keeper import Keeper
from postjob_sa.worker.scheduler import Scheduler
from postjob_sa.worker.signals import Stopper, WakeUp
from postjob_sa.worker.unknown import UnknownWorkflows
from postjob_sa.worker.wakeup import Waker

#: The longest a worker sleeps without looking at the queue.
WAIT_CAP = 30.0
#: A busy worker's checkouts reap expired leases and deadlines at most this often; an idle
#: one reaps before it waits, so the checkout after a wake-up does not pay for it.
REAP_INTERVAL = 1.0
#: A busy worker's checkouts make due the jobs whose time has come at most this often (and the
#: first checkout after a wait always does: the wait ended because one came due, maybe).
PROMOTE_INTERVAL = 0.05
#: How long an idle worker waits when a job is due that its checkout could not take (another
#: transaction holds its row): the n-th such miss in a row waits the n-th delay (a NOTIFY still
#: wakes it at once), so the worker never spins on a locked job.
MISS_DELAYS = (0.0, 0.02, 0.1, 0.25, 0.5, 1.0)


class Idle:
    """The idle side of one worker's loop (see the module docstring)."""

    def __init__(self, *, waker: Waker, keeper: Keeper, scheduler: Scheduler, stopper: Stopper,
                 unknown: UnknownWorkflows, params: Callable[[bool], dict[str, Any]]):
        self.waker = waker
        self.keeper = keeper
        self.scheduler = scheduler
        self.stopper = stopper
        self.unknown = unknown
        self._params = params  # what postjob.worker_idle needs, given whether to reap
        self._last_reap = float("-inf")
        self._last_promote = float("-inf")
        self._busy = True  # the first checkout reaps
        self._misses = 0
        #: reaped since the last job ran (drain: then it is done)
        self.reaped = False

    def worked(self) -> None:
        """A step of the loop did something: the next idle spell starts afresh."""
        self._misses = 0
        self.reaped = False
        self.waker.handed = None  # the wake-up was of use

    def reap_at_checkout(self) -> bool:
        """Whether the coming checkout reaps: a busy worker's now and then; after a wait (not
        busy) the wait just did."""
        now = time.monotonic()
        if self._busy and now - self._last_reap >= REAP_INTERVAL:
            self._last_reap = now
            return True
        return False

    def promote_at_checkout(self) -> bool:
        """Whether the coming checkout first makes due what has come due."""
        now = time.monotonic()
        if now - self._last_promote >= PROMOTE_INTERVAL:
            self._last_promote = now
            return True
        return False

    def checked_out(self, found: bool, reaped: bool) -> None:
        self._busy = found
        if not found:
            self.reaped = self.reaped or reaped

    def reap(self, conn: Conn) -> None:
        """Reap now (a draining worker does, once, before it calls the queue empty)."""
        seen = rescues.look(conn)
        conn.scalar(_sql.WORKER_IDLE, self._params(True))
        rescues.report(conn, seen)
        self._last_reap = time.monotonic()
        self.reaped = True

    def wait(self, conn: Conn, can_take: bool) -> None:
        """Wait until there may be work; ``can_take``: a job due now could start at once."""
        self.unknown.check_if_due(conn)
        now = time.monotonic()
        reap = now - self._last_reap >= REAP_INTERVAL
        if reap:
            self._last_reap = now
        seen = rescues.look(conn) if reap else []
        handed, self.waker.handed = self.waker.handed, None
        if handed is not None and self.keeper.worker_id is not None:
            # woken for a job, yet the checkout found nothing: another worker may use it
            conn.scalar(_sql.WORKER_PASS_WAKEUP, {"worker_id": self.keeper.worker_id,
                                                  "since": handed})
        self.waker.idle()  # first: a job that commits after the next statement wakes us
        params = self._params(reap)
        if not can_take:  # no free place: not marked waiting, a new job wakes another worker
            params["worker_id"] = None
        ttnj = conn.scalar(_sql.WORKER_IDLE, params)
        rescues.report(conn, seen)
        if ttnj is not None and ttnj <= 0 and can_take:
            # due now, yet the checkout found nothing to take: its row is locked by another
            # transaction (or it just became due); look again, less and less often
            timeout = MISS_DELAYS[min(self._misses, len(MISS_DELAYS) - 1)]
            self._misses += 1
        else:
            self._misses = 0
            timeout = WAIT_CAP if ttnj is None else min(max(float(ttnj), 0.0), WAIT_CAP)
        timeout = min(timeout, self.keeper.seconds_to_beat(), self.waker.cap or WAIT_CAP)
        if self.scheduler:
            timeout = min(timeout, self.scheduler.seconds_to_tick())
        if timeout <= 0 or self.stopper.requested:
            self.waker.not_waiting()
            return
        self._last_promote = float("-inf")  # the wait may end because a job came due
        try:
            with self.stopper.pausing():
                self.waker.wait(conn, timeout, self.stopper.wake_fd())
        except WakeUp:
            self.waker.not_waiting()
