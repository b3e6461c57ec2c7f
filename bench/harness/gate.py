"""The worker side of a benchmark run: `Gate`, its handle on the driver (see workers.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from bench.harness.measure import now


@dataclass
class WorkerReport:
    t_release: float
    t_end: float
    cpu_s: float
    starts: dict[int, float] = field(default_factory=dict)


class Gate:
    """The worker-side handle on the driver (lives in the worker process)."""

    def __init__(self, idx: int, listening: bool, channels: Channels) -> None:
        self.idx = idx
        self.listening = listening
        self._ch = channels
        self._t_release = 0.0
        self._cpu_release = 0.0
        self._t_end: float | None = None
        self._cpu_end = 0.0
        self.starts: dict[int, float] = {}

    # -- start ----------------------------------------------------------
    def arrive(self) -> None:
        """Report ready, then block until the driver releases all workers."""
        self._ch.events.put(("ready", self.idx, None))
        self._ch.release.wait()
        self._mark_release()

    async def arrive_async(self) -> None:
        self._ch.events.put(("ready", self.idx, None))
        await asyncio.to_thread(self._ch.release.wait)
        self._mark_release()

    def _mark_release(self) -> None:
        self._t_release = now()
        self._cpu_release = time.process_time()

    # -- while running --------------------------------------------------
    def stopping(self) -> bool:
        """True once the driver wants listening workers to stop."""
        return self._ch.stop.is_set()

    async def until_stop(self, poll_s: float = 0.02) -> None:
        while not self._ch.stop.is_set():
            await asyncio.sleep(poll_s)

    def job_started(self, key: int) -> None:
        """Call first thing in a job body; records the start time in listening mode."""
        if self.listening:
            self.starts[key] = now()

    # -- end --------------------------------------------------------------
    def ran(self) -> None:
        """Call right after the system's run call returns (stops the worker's clock).

        Blocks briefly until the driver has taken its CPU snapshot; close the
        connections only after this returns.
        """
        if self._t_end is not None:
            return
        self._t_end = now()
        self._cpu_end = time.process_time()
        self._ch.events.put(("ran", self.idx, None))
        self._ch.collected.wait(timeout=120)

    def report(self) -> WorkerReport:
        if self._t_end is None:
            self.ran()
        assert self._t_end is not None
        return WorkerReport(
            t_release=self._t_release,
            t_end=self._t_end,
            cpu_s=self._cpu_end - self._cpu_release,
            starts=self.starts,
        )


@dataclass
class Channels:
    events: Any  # multiprocessing queue of (kind, idx, payload); kind: ready|ran|done|error
    release: Any  # multiprocessing Event: start working
    stop: Any  # multiprocessing Event: listening workers stop
    collected: Any  # multiprocessing Event: the driver has its end-of-run snapshot
