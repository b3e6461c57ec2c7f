"""The contract between the benchmark driver and one job-queue system.

A system is a `System` subclass registered in `bench.systems`. The driver
gives each system its own fresh database and calls, in order:

* `setup(url)` once, then per measurement `reset(url)` (empty all queue state);
* (a)/(b) every `EnqueueVariant` from `enqueue_variants()`: a variant is one way
  of enqueueing (e.g. "api" and "session.add"); each can time a one-job-per-
  transaction loop and/or a batched loop and returns the elapsed seconds;
* (c) per `WorkerConfig`: `prefill()`, then `work()` in W spawned processes in
  drain mode, then `verify_drain()`;
* (d) per `WorkerConfig`: `work()` in listening mode while the driver enqueues
  through `open_producer()`;
* (e) `open_checkout_probe()` if the system supports it (else None);
* (f) `extra_metrics()` for anything system-specific (returns finished rows).
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from bench.harness.gate import Gate


@dataclass(frozen=True)
class Options:
    """System knobs chosen on the command line."""

    raw_batch: int = 100
    procrastinate_concurrency: tuple[int, ...] = (1, 8)
    pgqueuer_batch: tuple[int, ...] = (10, 100)
    extra: dict[str, str] = field(default_factory=dict)  # --opt key=value, for later systems


@dataclass(frozen=True)
class RunShape:
    """Sizes of the run, for systems that measure extra metrics themselves."""

    jobs: int
    workers: int
    reps: int
    quick: bool


@dataclass(frozen=True)
class WorkerConfig:
    """One way of running workers (a column of results): label + system-specific params."""

    label: str
    params: dict[str, Any]


@dataclass(frozen=True)
class EnqueueVariant:
    """One way of enqueueing. Callables time only the enqueue loop and return seconds.

    one_per_txn(url, keys): one job per transaction, sequentially, one job per key.
    batched(url, keys, batch): `batch` jobs per transaction.
    A key is an int the job carries as its argument; afterwards the queue must
    hold exactly len(keys) jobs (clean up any warm-up job yourself).
    """

    name: str
    one_per_txn: Callable[[str, Sequence[int]], float] | None = None
    batched: Callable[[str, Sequence[int], int], float] | None = None


@dataclass(frozen=True)
class DrainCheck:
    verified: bool
    detail: dict[str, Any]


@dataclass(frozen=True)
class Row:
    system: str
    config: str
    metric: str
    value: float
    unit: str


@dataclass(frozen=True)
class MetricSpec:
    """How the report shows a metric (systems may declare their extra metrics)."""

    key: str
    title: str
    unit: str
    higher_is_better: bool
    per_config: bool = False  # compare with raw/peers row of the same config only


@dataclass(frozen=True)
class CheckoutCase:
    """(e) table state: `finished` finished jobs + `ready` runnable ones.

    vacuumed=True: finished rows written as finished, then VACUUM ANALYZE.
    vacuumed=False: finished rows written runnable (older run times), then all
    marked finished in one UPDATE with autovacuum off for the table, no vacuum.
    """

    label: str
    finished: int
    ready: int
    vacuumed: bool


class Producer(Protocol):
    """(d) enqueues single jobs from the driver process."""

    def enqueue(self, key: int) -> tuple[float, float]:
        """Enqueue + commit one job; return now() just before the call and just after it."""

    def close(self) -> None: ...


class CheckoutProbe(Protocol):
    """(e) a connection ready to run single-job checkout transactions."""

    table_bytes: int
    index_bytes: int

    def checkout_one(self) -> bool:
        """One checkout transaction; True if it got a job."""

    def explain(self) -> str:
        """EXPLAIN (ANALYZE, BUFFERS) of one more checkout."""

    def close(self) -> None: ...


class System(ABC):
    name: ClassVar[str]
    #: compared against as a "peer" in the report (raw and our own package are not peers)
    is_peer: ClassVar[bool] = True
    #: import names that must be importable for the system to run
    requires: ClassVar[tuple[str, ...]] = ()
    #: distribution names whose versions go into the results
    distributions: ClassVar[tuple[str, ...]] = ()

    def unavailable_reason(self) -> str | None:
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        return f"not installed: {', '.join(missing)}" if missing else None

    @property
    def database(self) -> str:
        return f"pjbench_{self.name}"

    # -- schema and state -----------------------------------------------
    @abstractmethod
    def setup(self, url: str) -> None: ...

    @abstractmethod
    def reset(self, url: str) -> None: ...

    @abstractmethod
    def tables(self, url: str) -> list[str]:
        """Tables to ANALYZE before timed phases."""

    @abstractmethod
    def job_count(self, url: str) -> int:
        """Rows currently in the queue (used to check enqueue runs)."""

    # -- (a), (b) ---------------------------------------------------------
    @abstractmethod
    def enqueue_variants(self, opts: Options) -> list[EnqueueVariant]: ...

    # -- (c), (d) ---------------------------------------------------------
    @abstractmethod
    def worker_configs(self, opts: Options) -> list[WorkerConfig]: ...

    @abstractmethod
    def prefill(self, url: str, keys: Sequence[int]) -> None:
        """Untimed: enqueue no-op jobs for a drain."""

    @abstractmethod
    def work(self, url: str, config: WorkerConfig, gate: Gate) -> None:
        """Worker process body: connect, gate.arrive(), run, gate.ran().

        Drain mode (not gate.listening): run until the queue is empty.
        Listening mode: run until gate.stopping(); job bodies call gate.job_started(key).
        """

    @abstractmethod
    def verify_drain(self, url: str, jobs: int) -> DrainCheck: ...

    @abstractmethod
    def done_count(self, url: str) -> int:
        """Jobs in the done state (the latency test waits on it)."""

    @abstractmethod
    def open_producer(self, url: str) -> Producer: ...

    # -- optional (e), (f) ------------------------------------------------
    def open_checkout_probe(self, url: str, case: CheckoutCase) -> CheckoutProbe | None:
        return None

    def extra_metrics(self, url: str, opts: Options, shape: RunShape) -> list[Row]:
        return []

    def metric_specs(self) -> list[MetricSpec]:
        return []
