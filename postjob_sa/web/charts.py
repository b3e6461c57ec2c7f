"""The throughput chart's geometry: numbers only; the template draws it as inline SVG."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MINUTES = 60
STACK = ("ok", "failed", "timeout", "cancelled")  # the final states, bottom to top


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    status: str
    jobs: int
    minutes_ago: int


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass
class Chart:
    width: int = 1200
    height: int = 200
    left: int = 44  # room for the y labels
    bottom: int = 22  # room for the x labels
    bars: list[Bar] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    peak: int = 0

    @property
    def plot_height(self) -> int:
        return self.height - self.bottom - 6

    @property
    def slot(self) -> float:
        return (self.width - self.left) / MINUTES

    def x_of(self, minutes_ago: int) -> float:
        return self.left + (MINUTES - 1 - minutes_ago) * self.slot

    @property
    def x_labels(self) -> list[tuple[float, str]]:
        return [(self.x_of(m) + self.slot / 2, f"-{m}m" if m else "now") for m in (59, 45, 30, 15, 0)]


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 × 10^n at or above value."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= value:
                return m * step
        step *= 10


def throughput_chart(rows: Iterable[Any]) -> Chart:
    """Stacked bars of settled jobs per minute over the last hour, from rows of
    (minutes_ago, queue, status, jobs)."""
    per_minute: dict[int, dict[str, int]] = {}
    chart = Chart()
    for r in rows:
        minute = int(r.minutes_ago)
        if not 0 <= minute < MINUTES:
            continue
        cell = per_minute.setdefault(minute, {})
        cell[r.status] = cell.get(r.status, 0) + int(r.jobs)
        chart.totals[r.status] = chart.totals.get(r.status, 0) + int(r.jobs)
    chart.peak = max((sum(c.values()) for c in per_minute.values()), default=0)
    top = _nice_ceiling(max(chart.peak, 1))
    scale = chart.plot_height / top
    base = 6 + chart.plot_height
    for minute, cell in sorted(per_minute.items()):
        y = float(base)
        for status in STACK:
            jobs = cell.get(status, 0)
            if not jobs:
                continue
            h = max(jobs * scale, 1.0)
            y -= h
            chart.bars.append(
                Bar(round(chart.x_of(minute) + 1, 2), round(y, 2), round(chart.slot - 2, 2),
                    round(h, 2), status, jobs, minute)
            )
    chart.ticks = [Tick(round(base - v * scale, 2), f"{v:,}") for v in (0, top // 2, top)]
    return chart
