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
