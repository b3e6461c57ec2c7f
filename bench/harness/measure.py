"""Clocks, CPU accounting, pacing and summary statistics."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence


def now() -> float:
    """CLOCK_MONOTONIC in seconds; system-wide on Linux, so comparable across processes."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolation percentile (the usual 'linear' definition); NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100.0
    below = int(pos)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (pos - below)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """Busy CPU seconds summed over all cores since boot (first line of /proc/stat).

    Busy = user + nice + system + irq + softirq + steal (idle and iowait excluded).
    """
    with open("/proc/stat") as fh:
        fields = fh.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICKS


def run_on_schedule(count: int, spacing_s: float, action: Callable[[int], None]) -> None:
    """Call action(i) for i in 0..count-1, the i-th call starting at t0 + i * spacing_s."""
    start = now()
    for i in range(count):
        delay = start + i * spacing_s - now()
        if delay > 0:
            time.sleep(delay)
        action(i)


async def run_on_schedule_async(
    count: int, spacing_s: float, action: Callable[[int], Awaitable[None]]
) -> None:
    """Async twin of run_on_schedule()."""
    start = now()
    for i in range(count):
        delay = start + i * spacing_s - now()
        if delay > 0:
            await asyncio.sleep(delay)
        await action(i)


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process from /proc/<pid>/stat; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # fields from 'state' (3rd) on
    return (int(fields[11]) + int(fields[12])) / _TICKS


def busy_cores(window_s: float = 0.5) -> float:
    """Average number of busy cores over a short window."""
    b0, t0 = machine_busy_seconds(), now()
    time.sleep(window_s)
    return (machine_busy_seconds() - b0) / (now() - t0)


def wait_until_quiet(max_wait_s: float, threshold_cores: float = 0.3) -> dict[str, float | int]:
    """Before a timed phase: wait (at most max_wait_s) until the machine is nearly idle.

    The box is shared; this only lowers the odds of measuring someone else's load.
    Returns how long it waited and the last busy-cores sample.
    """
    start = now()
    busy = busy_cores()
    while busy > threshold_cores and now() - start < max_wait_s:
        busy = busy_cores()
    state: dict[str, float | int] = {
        "waited_s": round(now() - start, 2),
        "busy_cores": round(busy, 3),
    }
    return state
