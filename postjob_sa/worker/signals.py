"""Stopping a worker with SIGINT/SIGTERM: the first signal lets the running jobs finish, the
second stops at once and hands them back."""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

log = logging.getLogger("postjob_sa.worker")
T = TypeVar("T")

#: How often a thread waiting for a job that runs elsewhere looks whether it was aborted.
ABORT_POLL = 0.1


def raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in another thread at its next Python instruction, as a signal's handler
    raises in the main thread (None withdraws one not raised yet). A thread blocked in a call
    (a sleep, a socket read) gets it when the call returns: no more of its code runs."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc))


class Abort(BaseException):
    """Stops the running job at once (a second SIGINT/SIGTERM); the job is released."""


class WakeUp(BaseException):
    """Breaks a wait when a stop is requested."""


class _Running:
    """:meth:`Stopper.running`'s context."""

    __slots__ = ("_stopper",)

    def __init__(self, stopper: Stopper) -> None:
        self._stopper = stopper

    def __enter__(self) -> None:
        self._stopper._enter_job()

    def __exit__(self, *exc: object) -> None:
        self._stopper._leave_job()


class Stopper:
    """What the worker loop knows of stop requests: set by signals or by :meth:`request`.

    ``in_job`` and ``waiting`` say where the loop is, so that a signal interrupts it in the
    right way (a wait is broken at once; a job only by the second signal).
    """

    def __init__(self) -> None:
        self.requested = False
        #: stop at once, handing the running jobs back (a second signal seen by another thread)
        self.aborted = False
        self.in_job = False
        self.waiting = False
        self._signals = 0
        self._pipe: tuple[int, int] | None = None
        # the thread in running(), and whether abort() raised Abort in it (under the lock:
        # an abort that comes as the jobs end is withdrawn, never raised outside them)
        self._lock = threading.Lock()
        self._job_thread: int | None = None
        self._posted = False
        self._running = _Running(self)

    def running(self) -> _Running:
        """Around running jobs (or waiting for them to end): only a second signal (or
        :meth:`abort`) stops them. (A plain context manager, not a generator: it is entered
        around every job.)"""
        return self._running

    def _enter_job(self) -> None:
        with self._lock:
            self.in_job = True
            self._job_thread = threading.get_ident()

    def _leave_job(self) -> None:
        with self._lock:
            self.in_job = False
            if self._posted and self._job_thread is not None:
                raise_in(self._job_thread, None)
            self._posted = False
            self._job_thread = None

    def abort(self, why: str) -> None:
        """Stop at once, from another thread (a second stop request): Abort is raised in the
        thread that runs the jobs (or waits for them), which hands them back."""
        if not self.aborted:
            log.warning("%s: stopping now, handing the running jobs back", why)
        self.requested = True
        self.aborted = True
        with self._lock:
            thread = self._job_thread
            if self.in_job and thread is not None and thread != threading.get_ident() \
                    and not self._posted:
                raise_in(thread, Abort)
                self._posted = True
        self._wake()

    def wait_for(self, future: concurrent.futures.Future[T]) -> T:
        """The result of a job that runs elsewhere (the event loop of async jobs), waited
        for in short steps: an :meth:`abort` reaches this thread only between them."""
        while True:
            try:
                return future.result(timeout=ABORT_POLL)
            except concurrent.futures.TimeoutError:
                if future.done():
                    return future.result()
                if self.aborted:
                    raise Abort() from None

    @contextmanager
    def pausing(self) -> Iterator[None]:
        """Around a pause of the loop: a signal breaks it at once (:class:`WakeUp`)."""
        self.waiting = True
        try:
            yield
        finally:
            self.waiting = False

    def wake_fd(self) -> int:
        """A descriptor that becomes readable when a stop is asked for from another thread."""
        if self._pipe is None:
            self._pipe = os.pipe()
            os.set_blocking(self._pipe[1], False)
        return self._pipe[0]

    def _wake(self) -> None:
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], b"!")
            except BlockingIOError:  # woken already
                pass

    def close(self) -> None:
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def request(self, why: str) -> None:
        """Stop after the running jobs (from any thread)."""
        if not self.requested:
            log.warning("%s: stopping after the running jobs", why)
        self.requested = True
        self._wake()

    def signalled(self, signum: int) -> None:
        """A signal an event loop's handler caught for the worker (which runs in another
        thread): the first stops after the running jobs, the second hands them back."""
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            self.request(f"received {name}")
            return
        self.abort(f"received {name} again")

    @contextmanager
    def handlers(self, enabled: bool) -> Iterator[None]:
        """Install SIGINT/SIGTERM handlers for the duration (main thread only)."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, self._on_signal)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self.requested = True
        name = signal.Signals(signum).name
        if self._signals == 1:
            log.warning("received %s: stopping after the running jobs (send again to stop at "
                        "once)", name)
            if self.waiting:
                raise WakeUp()
            return
        log.warning("received %s again: stopping now", name)
        if self.in_job:
            raise Abort()
        if self.waiting:
            raise WakeUp()
