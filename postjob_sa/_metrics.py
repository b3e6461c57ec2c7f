"""The process's own metrics: every instrumentation point of the package is a function here.

With ``prometheus-client`` installed (the ``metrics`` extra) they count into metrics that no
registry holds until a host registers :class:`postjob_sa.metrics.PostjobCollector` (or
``postjob run --metrics-port`` serves them); without it every function does nothing. Under
``postjob run --processes N`` the children count into the files of prometheus-client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), which the supervisor serves.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any


def _library() -> ModuleType | None:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:  # the metrics extra is not installed
        return None


prometheus = _library()

#: Run times from 1 ms to 10 min.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0, 600.0)


class _Nothing:
    """Stands in for a metric when prometheus-client is absent."""

    def labels(self, *values: str) -> _Nothing:
        return self

    def inc(self, amount: float = 1.0) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
    if prometheus is None:
        return _Nothing()
    return prometheus.Counter(name, doc, labels, registry=None)


ENQUEUED = _counter("postjob_jobs_enqueued", "Jobs enqueued by this process (counted when "
                    "enqueue() is called, also if the transaction rolls back later).",
                    ("workflow", "queue"))
STARTED = _counter("postjob_jobs_started", "Jobs this process checked out to run.",
                   ("workflow", "queue"))
FINISHED = _counter("postjob_jobs_finished", "Runs that ended and were recorded, by outcome: "
                    "ok, err (will retry), failed, sleep (waits for a child), release "
                    "(handed back), lost (the lease was gone).", ("workflow", "outcome"))
LEASE_LOSSES = _counter("postjob_lease_losses", "Runs whose lease was gone when they ended "
                        "(reaped, reset or resolved meanwhile): their outcome was not recorded.",
                        ("workflow",))
RECONNECTS = _counter("postjob_worker_reconnects", "Times a worker lost its connection and "
                      "connected again.")
WAKEUPS = _counter("postjob_worker_wakeups", "Idle waits ended because a job came, by what woke "
                   "the worker: notification, supervisor or poll.", ("source",))
DURATION: Any = (
    _Nothing() if prometheus is None else prometheus.Histogram(
        "postjob_job_duration_seconds", "How long runs took, by workflow.", ("workflow",),
        buckets=DURATION_BUCKETS, registry=None)
)
#: Everything above, in the order a collector yields it.
ALL = [m for m in (ENQUEUED, STARTED, FINISHED, LEASE_LOSSES, RECONNECTS, WAKEUPS, DURATION)
       if not isinstance(m, _Nothing)]


# A labelled child is looked up once per label values, not on every count (labels() costs more
# than the count itself on a worker's hot path).
_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (id(metric), values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def enqueued(workflow: str, queue: str, count: int = 1) -> None:
    _child(ENQUEUED, workflow, queue).inc(count)


def started_many(counts: Mapping[tuple[str, str], int]) -> None:
    """Jobs checked out, by (workflow, queue): one count per pair for a whole batch."""
    for (workflow, queue), n in counts.items():
        _child(STARTED, workflow, queue).inc(n)


def finished_many(counts: Mapping[tuple[str, str], int]) -> None:
    """Runs recorded, by (workflow, outcome): one count per pair for a whole batch."""
    for (workflow, outcome), n in counts.items():
        _child(FINISHED, workflow, outcome).inc(n)


def duration(workflow: str, seconds: float) -> None:
    """How long one run took (release outcomes are not counted)."""
    _child(DURATION, workflow).observe(seconds)


def finished(workflow: str, outcome: str, seconds: float) -> None:
    """One run recorded (transactional jobs, one at a time)."""
    _child(FINISHED, workflow, outcome).inc()
    if outcome != "release":
        duration(workflow, seconds)


def lease_lost(workflow: str) -> None:
    _child(LEASE_LOSSES, workflow).inc()
    _child(FINISHED, workflow, "lost").inc()


def reconnected() -> None:
    RECONNECTS.inc()


def woken(source: str) -> None:
    _child(WAKEUPS, source).inc()
