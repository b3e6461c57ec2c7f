"""postjob_sa: our own package (adapter not written yet).

To be filled in by the package author. The intended shape:

* setup(): create the schema the way an application would (migrations / metadata).
* enqueue_variants(): several variants, each reported under its own config name,
  e.g. "api"          -> `postjob_sa.JobQueue(session).enqueue(...)`, one commit per job,
                          and `JobQueue(session).enqueue_many(...)` for the batched run;
       "session.add"  -> `session.add(postjob_sa.Job(...))` + `session.commit()`, and
                          `session.add_all([...])` batched.
* work(): what `postjob run` does in a worker process, in its "stop when the queue is
  empty" mode for drains (gate.listening False) and listening otherwise; the job body
  calls gate.job_started(key) first.
* open_checkout_probe(): (e) a single-job checkout transaction on a prepared table.
* extra_metrics() + metric_specs(): e.g. (f) "fan-out of 1,000 children": wall time
  and number of parent re-runs, as `Row(system, config, metric, value, unit)`.

Until then the driver lists the system as skipped with the reason below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from bench.systems.base import (
    DrainCheck,
    EnqueueVariant,
    Options,
    Producer,
    System,
    WorkerConfig,
)

if TYPE_CHECKING:
    from bench.harness.workers import Gate

REASON = (
    "the postjob_sa benchmark adapter is not implemented yet: "
    "fill in bench/systems/postjob_sa.py (see its docstring)"
)


def _todo() -> NoReturn:
    raise NotImplementedError(REASON)


class PostjobSA(System):
    name = "postjob_sa"
    is_peer = False
    requires = ("postjob_sa", "sqlalchemy")
    distributions = ("postjob_sa", "SQLAlchemy", "psycopg2-binary")

    def unavailable_reason(self) -> str | None:
        return REASON

    def setup(self, url: str) -> None:
        _todo()

    def reset(self, url: str) -> None:
        _todo()

    def tables(self, url: str) -> list[str]:
        _todo()

    def job_count(self, url: str) -> int:
        _todo()

    def enqueue_variants(self, opts: Options) -> list[EnqueueVariant]:
        _todo()

    def worker_configs(self, opts: Options) -> list[WorkerConfig]:
        _todo()

    def prefill(self, url: str, keys: Sequence[int]) -> None:
        _todo()

    def work(self, url: str, config: WorkerConfig, gate: Gate) -> None:
        _todo()

    def verify_drain(self, url: str, jobs: int) -> DrainCheck:
        _todo()

    def done_count(self, url: str) -> int:
        _todo()

    def open_producer(self, url: str) -> Producer:
        _todo()
