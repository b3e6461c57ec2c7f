"""The supervisor's side of the wake-up relay (the children's side is ``postjob_sa.worker.wakeup``).

One process per host listens for ``postjob_notifications`` (on a direct connection: a pooler in
transaction mode cannot carry a LISTEN) and wakes *one* idle child per notification, instead of
every idle worker waking on every NOTIFY. Each child has a socket to the supervisor; it says when
it goes idle (``IDLE``), when it stopped waiting on its own (``BUSY``) and when its checkout came
back full (``MORE``: the supervisor wakes the next idle child, so a burst of jobs fans out one
child at a time). The most recently idle child is woken first: under a light load a few children
do the work and the others' connections stay unused.

Without a connection to listen on (``--pooled`` without ``--wakeup-url``) the relay wakes one
idle child every ``poll_interval`` seconds instead: one host polls, not every process.
"""

from __future__ import annotations

import logging
import select
import socket
import time

from sqlalchemy import Engine

from postjob_sa import _sql
from postjob_sa._db import Conn, close_quietly
from postjob_sa.worker.outages import Backoff
from postjob_sa.worker.wakeup import BUSY, IDLE, MORE, WAKE

log = logging.getLogger("postjob_sa.cli")

RECONNECT_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)


class Relay:
    """Idle children and the LISTEN connection of one supervisor."""

    def __init__(self, engine: Engine | None, *, poll_interval: float, name: str):
        self.engine = engine
        self.poll_interval = poll_interval
        self.name = name
        self.conn: Conn | None = None
        self.children: dict[int, socket.socket] = {}  # child number -> our end
        self._their_ends: dict[int, socket.socket] = {}
        self.idle: list[int] = []  # most recently idle last
        self.wakes = 0
        self._backoff = Backoff(RECONNECT_DELAYS)
        self._connect_at = 0.0
        self._next_poll = time.monotonic() + poll_interval

    # -- children ------------------------------------------------------------------------------

    def add(self, number: int) -> int:
        """A socket for child ``number``: returns the descriptor to hand it (see started)."""
        self.remove(number)
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        self.children[number] = ours
        self._their_ends[number] = theirs
        return theirs.fileno()

    def started(self, number: int) -> None:
        """The child has its end now: close ours of it."""
        theirs = self._their_ends.pop(number, None)
        if theirs is not None:
            theirs.close()

    def remove(self, number: int) -> None:
        self.started(number)
        sock = self.children.pop(number, None)
        if sock is not None:
            sock.close()
        if number in self.idle:
            self.idle.remove(number)

    def _read(self, number: int) -> None:
        sock = self.children[number]
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the child is gone (its exit is noticed by the supervisor)
            self.remove(number)
            return
        for message in (data[i:i + 1] for i in range(len(data))):
            if message in (IDLE, BUSY) and number in self.idle:
                self.idle.remove(number)
            if message == IDLE:
                self.idle.append(number)
            elif message == MORE:
                self.wake("a full checkout")

    def wake(self, why: str) -> bool:
        """Wake the most recently idle child; False if none is idle."""
        while self.idle:
            number = self.idle.pop()
            try:
                self.children[number].send(WAKE)
            except (OSError, KeyError):
                continue
            self.wakes += 1
            log.debug("woke worker %d (%s)", number, why)
            return True
        return False

    # -- the loop ------------------------------------------------------------------------------

    def serve(self, timeout: float) -> None:
        """Relay for up to ``timeout`` seconds: children's messages first, then notifications
        (a child that said IDLE before a job committed is counted as idle for it)."""
        self._connect_if_due()
        by_fd = {sock.fileno(): number for number, sock in self.children.items()}
        watched = list(by_fd)
        conn_fd = self.conn.raw.fileno() if self.conn is not None else None
        if conn_fd is not None:
            watched.append(conn_fd)
        if self.engine is None:
            timeout = max(0.0, min(timeout, self._next_poll - time.monotonic()))
        readable, _, _ = select.select(watched, [], [], timeout)
        for fd in readable:
            if fd in by_fd and by_fd[fd] in self.children:
                self._read(by_fd[fd])
        if conn_fd is not None and conn_fd in readable:
            self._notifications()
        if self.engine is None and time.monotonic() >= self._next_poll:
            self._next_poll = time.monotonic() + self.poll_interval
            self.wake("poll")

    def _notifications(self) -> None:
        assert self.conn is not None
        try:
            notified = self.conn.read_notifications()
        except Exception as exc:
            self._lost(exc)
            return
        if notified:
            self.wake("a notification")

    def _connect_if_due(self) -> None:
        if self.engine is None or self.conn is not None or time.monotonic() < self._connect_at:
            return
        try:
            conn = Conn.open(self.engine, name=self.name)
            try:
                conn.listen(_sql.WORKER_LISTEN)
            except BaseException:
                conn.close()
                raise
        except Exception as exc:
            self._lost(exc)
            return
        if self._backoff.reset():
            log.warning("listening for jobs again")
            self.wake("a reconnect (notifications may have been missed)")
        self.conn = conn

    def _lost(self, exc: Exception) -> None:
        close_quietly(self.conn)
        self.conn = None
        delay = self._backoff.next()
        self._connect_at = time.monotonic() + delay
        log.warning("the supervisor cannot listen for jobs (%s); trying again in %.1fs "
                    "(the workers look at the queue at least every 30 s meanwhile)",
                    " ".join(str(exc).split())[:200], delay)

    def close(self) -> None:
        close_quietly(self.conn)
        self.conn = None
        for number in list(self.children):
            self.remove(number)
