"""What wakes an idle worker when a job becomes runnable.

Three sources, one interface (:class:`Waker`):

- :class:`ListenWaker`: LISTEN on the worker's own connection (the default), or on a direct
  connection of its own when work goes through a pooler: on a channel of its own
  (``postjob_worker_<id>``), on which a new job wakes the one worker that has waited longest
  among those that serve its queue, workflow and version (``postjob._wake_for``: what a worker
  serves is in its row of ``postjob.workers``), and on ``postjob_notifications``, which every
  worker hears when no such worker was waiting.
- :class:`RelayWaker`: a worker process under the supervisor of ``postjob run --processes N``.
  The supervisor alone listens (one connection per host) and wakes one idle child per
  notification over a socket; the child tells it when it goes idle and when its checkout came
  back full (then the supervisor wakes the next idle child: a burst fans out one at a time).
- :class:`PollWaker`: no wake-ups at all (a worker behind a pooler in transaction mode, with no
  direct connection): it looks at the queue every ``interval`` seconds.

The worker calls :meth:`Waker.attach` after it connects (before its first checkout, so that no
notification is missed), :meth:`Waker.own_channel` once it has its id, :meth:`Waker.idle`
before it asks how long to wait, :meth:`Waker.wait` to wait, :meth:`Waker.not_waiting` when it
decides not to wait after all, and :meth:`Waker.backlog` when a checkout filled every free
place.
"""

from __future__ import annotations

import logging
import os
import select
import socket

from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from postjob_sa import _metrics, _sql
from postjob_sa._db import Conn, close_quietly
from postjob_sa.errors import InvalidArgument

log = logging.getLogger("postjob_sa.worker")

#: The messages of the relay, one byte each. Child to supervisor:
IDLE = b"i"  # I wait from now on: wake me when a job comes
BUSY = b"b"  # I stopped waiting on my own (time-out, a beat, a job due): do not count on me
MORE = b"m"  # my checkout came back full: more jobs may wait, wake another idle child
#: Supervisor to child:
WAKE = b"w"
#: The environment variable that hands a child its end of the relay (a file descriptor).
RELAY_FD_ENV = "POSTJOB_RELAY_FD"


class Waker:
    """No wake-ups: a worker that only looks at the queue when its wait times out."""

    #: The longest wait (None: as long as the worker likes).
    cap: float | None = None
    source = "timeout"
    #: whether the worker listens on a channel of its own (then it is marked waiting before it
    #: waits, and a new job wakes it alone), and the worker id of that channel
    private = False
    worker_id: int | None = None
    #: when the wake-up that ended the last wait was sent (its payload), while the worker may
    #: still pass it on (it found nothing to take: see Idle.wait)
    handed: str | None = None

    def attach(self, conn: Conn) -> None:
        """The worker (re)connected: get ready to notice jobs from now on."""

    def own_channel(self, conn: Conn, worker_id: int | None) -> None:
        """The worker registered as ``worker_id``: listen on its own channel too (if it can)."""

    def reset(self) -> None:
        """The worker's connection was lost: let go of what belongs to it."""

    def idle(self) -> None:
        """The worker is about to ask how long to wait, then wait."""

    def not_waiting(self) -> None:
        """The worker asked, and goes on without waiting."""

    def backlog(self) -> None:
        """A checkout took as many jobs as it asked for: more may be waiting."""

    def wait(self, conn: Conn, timeout: float, stop_fd: int) -> bool:
        """Wait up to ``timeout`` seconds; True when woken for a job."""
        conn.wait(timeout, stop_fd)
        return False

    def close(self) -> None:
        """The worker stops."""

    def _woken(self, woken: bool) -> bool:
        if woken:
            _metrics.woken(self.source)
            log.debug("woken by %s", self.source)
        return woken


class ListenWaker(Waker):
    """LISTEN on the worker's connection, or on a direct connection made by ``engine``."""

    source = "notification"

    def __init__(self, engine: Engine | None = None, name: str | None = None):
        self.engine = engine
        self.name = name
        self._own: Conn | None = None

    def _channels(self) -> list[str]:
        if self.worker_id is None:
            return [_sql.WORKER_LISTEN]
        return [_sql.WORKER_LISTEN, _sql.WORKER_LISTEN_OWN.format(worker_id=self.worker_id)]

    def attach(self, conn: Conn) -> None:
        if self.engine is None:
            for channel in self._channels():
                conn.listen(channel)
            return
        if self._own is None or self._own.closed:
            own = Conn.open(self.engine, name=self.name)
            try:
                for channel in self._channels():
                    own.listen(channel)
            except BaseException:
                own.close()
                raise
            self._own = own

    def own_channel(self, conn: Conn, worker_id: int | None) -> None:
        if worker_id is None:
            return
        self.worker_id = int(worker_id)
        listening = conn if self._own is None else self._own
        listening.listen(_sql.WORKER_LISTEN_OWN.format(worker_id=self.worker_id))
        self.private = True

    def reset(self) -> None:
        close_quietly(self._own)
        self._own = None

    def wait(self, conn: Conn, timeout: float, stop_fd: int) -> bool:
        listening = conn if self._own is None else self._own
        woken = listening.wait(timeout, stop_fd)
        self.handed = _latest(listening.take_payloads()) if woken else None
        return self._woken(woken)

    def close(self) -> None:
        self.reset()


def _latest(payloads: list[str]) -> str | None:
    """The latest moment (epoch seconds) the payloads of a worker's wake-ups name."""
    stamps: list[tuple[float, str]] = []
    for payload in payloads:
        try:
            stamps.append((float(payload), payload))
        except ValueError:
            continue
    return max(stamps)[1] if stamps else None


class PollWaker(Waker):
    """Look at the queue at least every ``interval`` seconds (nothing else wakes the worker)."""

    source = "poll"

    def __init__(self, interval: float):
        self.cap = interval


class RelayWaker(Waker):
    """The child's end of the supervisor's relay (see the module docstring)."""

    source = "supervisor"

    def __init__(self, fd: int):
        self.sock: socket.socket | None = socket.socket(fileno=fd)
        self.sock.setblocking(False)
        self._full = False  # the last checkout was full: MORE was sent already

    def _send(self, message: bytes) -> None:
        if self.sock is None:
            return
        try:
            self.sock.send(message)
        except BlockingIOError:  # the supervisor is far behind: it will wake us anyway
            pass
        except OSError:
            self._lost()

    def _lost(self) -> None:
        log.warning("the supervisor is gone: this worker looks at the queue every second")
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.cap = 1.0

    def idle(self) -> None:
        self._full = False
        self._send(IDLE)

    def not_waiting(self) -> None:
        self._send(BUSY)

    def backlog(self) -> None:
        if not self._full:  # once per run of full checkouts: the children it wakes fan out
            self._full = True
            self._send(MORE)

    def wait(self, conn: Conn, timeout: float, stop_fd: int) -> bool:
        if self.sock is None:
            conn.wait(timeout, stop_fd)
            return False
        conn.wait(timeout, stop_fd, [self.sock.fileno()])
        woken = self._take()
        if not woken:
            self._send(BUSY)
        return self._woken(woken)

    def _take(self) -> bool:
        """Whether the supervisor woke us (reads what it sent)."""
        if self.sock is None:
            return False
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        try:
            data = self.sock.recv(64)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._lost()
            return False
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def relay_from_environment() -> RelayWaker | None:
    """The relay a supervisor handed this process, if any (taken out of the environment, so
    that processes this one starts do not believe they have it)."""
    fd = os.environ.pop(RELAY_FD_ENV, None)
    if fd is None or not fd.isdigit():
        return None
    return RelayWaker(int(fd))


def choose_waker(pooled: bool, wakeup_url: URL | None, poll_interval: float,
                 identifier: str) -> Waker:
    """LISTEN on the worker's own connection; behind a pooler, on a direct connection to
    ``wakeup_url`` when there is one, else poll."""
    if wakeup_url is not None:
        engine = create_engine(wakeup_url, poolclass=NullPool)
        return ListenWaker(engine, name=f"postjob wakeup {identifier}")
    if pooled:
        return PollWaker(poll_interval)
    return ListenWaker()


def wakeup_url_of(value: object) -> URL:
    """A wake-up URL as given (a string or a SQLAlchemy URL), or InvalidArgument."""
    if isinstance(value, URL):
        return value
    if isinstance(value, str):
        try:
            return make_url(value)
        except (ArgumentError, ValueError):
            pass
    raise InvalidArgument("wakeup_url must be a database URL (postgresql://...), not "
                          + ("that string" if isinstance(value, str) else repr(value)))
