"""The jobs a worker holds: each one's lease token, the leases that ended, the jobs lost.

A checkout hands its jobs out under one lease (a row of ``postjob.leases``); the worker holds
them until their outcomes are recorded, they are handed back, or their runs find the job gone.
A lease none of the held jobs carries any more has ended: the next cycle deletes its row. The
heartbeat extends the leases of the held jobs and marks the ones no longer the worker's (lost),
which the running code checks (:meth:`HeldJobs.is_lost`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class HeldJobs:
    """A thread-safe book of held jobs (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # job id -> lease token
        self._carried: dict[int, int] = {}  # lease token -> held jobs that carry it
        self._ended: list[int] = []
        self._lost: set[int] = set()

    def hold(self, leases: Iterable[tuple[int, int]]) -> None:
        with self._lock:
            for job_id, token in leases:
                if job_id in self._held:
                    continue
                self._held[job_id] = token
                self._carried[token] = self._carried.get(token, 0) + 1

    def release(self, ids: Iterable[int]) -> None:
        """These jobs' runs have ended (recorded, handed back or lost)."""
        with self._lock:
            for job_id in ids:
                self._lost.discard(job_id)
                token = self._held.pop(job_id, None)
                if token is None:
                    continue
                left = self._carried[token] - 1
                if left:
                    self._carried[token] = left
                else:
                    del self._carried[token]
                    self._ended.append(token)

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

    def take_ended(self) -> list[int]:
        """The leases whose jobs have all ended since the last call."""
        with self._lock:
            ended, self._ended = self._ended, []
            return ended

    def put_back_ended(self, tokens: list[int]) -> None:
        """Leases taken that could not be released (the cycle failed): the next one tries."""
        if tokens:
            with self._lock:
                self._ended[:0] = tokens
