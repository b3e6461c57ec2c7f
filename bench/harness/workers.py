"""Worker processes: spawn, wait until all are connected, release together, collect.

Each worker is a fresh `spawn` process. Inside it the system's `work()` gets a
`Gate`: it connects, calls `gate.arrive()` (announce "ready" and block until
the driver releases everyone), runs, and calls `gate.ran()` as soon as its run
call returns. The driver's clock starts at release; CPU per worker is
`time.process_time()` between release and `ran()`.

`ran()` reports to the driver at once and waits for an acknowledgement, so the
workers' database sessions are still open when the driver takes its CPU
snapshot: the CPU of this database's backends is read from /proc directly,
which keeps that figure clean even when something else loads the machine.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.harness.gate import Channels, Gate, WorkerReport
from bench.harness.measure import machine_busy_seconds, now, process_cpu_seconds

SPAWN = mp.get_context("spawn")


class WorkerError(RuntimeError):
    """A worker process failed, died, or did not finish in time."""


def _worker_main(
    system_name: str, url: str, config: Any, listening: bool, idx: int, ch: Channels
) -> None:
    from bench.systems import get_system

    try:
        gate = Gate(idx, listening, ch)
        get_system(system_name).work(url, config, gate)
        ch.events.put(("done", idx, gate.report()))
    except BaseException:
        ch.events.put(("error", idx, traceback.format_exc()))
        raise


@dataclass
class PoolOutcome:
    t_release: float
    reports: list[WorkerReport]
    machine_busy_s: float  # all cores, release -> last ran()
    backend_cpu_s: float  # CPU of the database's sessions (workers' backends), same window

    @property
    def t_last_end(self) -> float:
        return max(r.t_end for r in self.reports)

    @property
    def worker_cpu_s(self) -> float:
        return sum(r.cpu_s for r in self.reports)


def run_workers(
    system_name: str,
    url: str,
    config: Any,
    *,
    count: int,
    listening: bool,
    while_running: Callable[[], None] | None = None,
    timeout_s: float = 600.0,
) -> PoolOutcome:
    """Run `count` worker processes of a system and wait for all of them to report.

    `while_running` (latency test) runs in the driver right after release; the
    stop event is set when it returns.
    """
    from bench.harness.pg import backend_pids

    ch = Channels(
        events=SPAWN.Queue(), release=SPAWN.Event(), stop=SPAWN.Event(), collected=SPAWN.Event()
    )
    procs = [
        SPAWN.Process(
            target=_worker_main,
            args=(system_name, url, config, listening, i, ch),
            name=f"bench-{system_name}-{i}",
            daemon=True,
        )
        for i in range(count)
    ]
    for p in procs:
        p.start()
    try:
        _collect(ch, procs, "ready", count, deadline=time.monotonic() + 120)
        backends = {pid: process_cpu_seconds(pid) for pid in backend_pids(url)}
        busy0 = machine_busy_seconds()
        t_release = now()
        ch.release.set()
        if while_running is not None:
            while_running()
            ch.stop.set()
        _collect(ch, procs, "ran", count, deadline=time.monotonic() + timeout_s)
        busy = machine_busy_seconds() - busy0
        backend_cpu = 0.0
        for pid, before in backends.items():
            after = process_cpu_seconds(pid)
            if before is not None and after is not None:
                backend_cpu += after - before
        ch.collected.set()
        done = _collect(ch, procs, "done", count, deadline=time.monotonic() + 120)
        for p in procs:
            p.join(timeout=30)
        reports = [done[i] for i in range(count)]
        return PoolOutcome(t_release, reports, machine_busy_s=busy, backend_cpu_s=backend_cpu)
    finally:
        ch.stop.set()
        ch.release.set()
        ch.collected.set()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _collect(
    ch: Channels, procs: list[Any], kind: str, count: int, *, deadline: float
) -> dict[int, Any]:
    got: dict[int, Any] = {}
    while len(got) < count:
        try:
            msg = ch.events.get(timeout=0.5)
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise WorkerError(f"worker(s) died while waiting for '{kind}': {dead}") from None
            if time.monotonic() > deadline:
                raise WorkerError(f"only {len(got)}/{count} workers reached '{kind}'") from None
            continue
        if msg[0] == "error":
            raise WorkerError(f"worker {msg[1]} failed:\n{msg[2]}")
        if msg[0] == kind:
            got[msg[1]] = msg[2]
    return got
