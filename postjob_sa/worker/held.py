"""The jobs a worker holds: each one's lease token, the runs that stopped, the jobs lost.

A checkout hands its jobs out under one lease token, written into their rows of
``postjob.unfinished``; the worker holds them until their outcomes are recorded, they are
handed back, or their runs find the job gone. A run that stopped without an outcome to record
(its job was cancelled, or ended with a failed ancestor, while it ran) is told to the
database with the next cycle, which ends its lease: until then the job keeps its place in a
limited queue and reset waits. The heartbeat marks the held jobs no longer the worker's
(lost), which the running code checks (:meth:`HeldJobs.is_lost`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class HeldJobs:
    """A thread-safe book of held jobs (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # job id -> lease token
        self._stopped: list[tuple[int, int]] = []
        self._lost: set[int] = set()

    def hold(self, leases: Iterable[tuple[int, int]]) -> None:
        with self._lock:
            for job_id, token in leases:
                self._held.setdefault(job_id, token)

    def release(self, ids: Iterable[int]) -> None:
        """These jobs' runs have ended and their outcomes are recorded (or handed back)."""
        with self._lock:
            for job_id in ids:
                self._lost.discard(job_id)
                self._held.pop(job_id, None)

    def stop(self, ids: Iterable[int]) -> None:
        """These jobs' runs stopped with no outcome to record: the next cycle says so."""
        with self._lock:
            for job_id in ids:
                self._lost.discard(job_id)
                token = self._held.pop(job_id, None)
                if token is not None:
                    self._stopped.append((job_id, token))

    def snapshot(self) -> dict[int, int]:
        """The held jobs now, id -> lease token (for a heartbeat)."""
        with self._lock:
            return dict(self._held)

    def mark_lost(self, ids: Iterable[int]) -> list[int]:
        """Note these held jobs as no longer ours; returns the ones newly noted."""
        with self._lock:
            fresh = [i for i in ids if i in self._held and i not in self._lost]
            self._lost.update(fresh)
            return fresh

    def is_lost(self, job_id: int) -> bool:
        """Whether a heartbeat found this job no longer ours (cancelled, reaped, reset)."""
        with self._lock:
            return job_id in self._lost

    def take_stopped(self) -> list[tuple[int, int]]:
        """The runs that stopped without an outcome since the last call (id, lease token)."""
        with self._lock:
            stopped, self._stopped = self._stopped, []
            return stopped

    def put_back_stopped(self, stopped: list[tuple[int, int]]) -> None:
        """Stopped runs taken that could not be told (the cycle failed): the next one tries."""
        if stopped:
            with self._lock:
                self._stopped[:0] = stopped

    @property
    def has_stopped(self) -> bool:
        with self._lock:
            return bool(self._stopped)
