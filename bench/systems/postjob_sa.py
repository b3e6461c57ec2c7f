"""postjob_sa: our own package, used the way an application uses it.

* setup: `postjob_sa.migrate(url)` (the package's Alembic revisions);
* enqueue "api": `JobQueue(session).enqueue(...)` + `session.commit()` per job, and
  `JobQueue(session).enqueue_many(...)` for the batched run; "session.add":
  `session.add(Job(...))` + commit, and `session.add_all([...])` batched;
* workers: what `postjob run` does — `JobQueue(Session(engine), batch_size=b).work()`,
  stopped by SIGTERM in listening mode, `drain()` in drain mode;
* (e) a single-job checkout through the worker's own prepared cycle statement;
* (f) a fan-out of N children under one parent vs draining N independent jobs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench.harness import pg
from bench.harness.measure import now
from bench.harness.workers import SPAWN
from bench.systems.base import (
    CheckoutCase,
    DrainCheck,
    EnqueueVariant,
    MetricSpec,
    Options,
    Row,
    RunShape,
    System,
    WorkerConfig,
)

if TYPE_CHECKING:
    from bench.harness.gate import Gate

NOOP = "bench.noop"
FAN_PARENT = "bench.fan_parent"

_gate: Any = None
_parent_runs = 0


def _register() -> None:
    import postjob_sa

    if postjob_sa.registry.default_registry.get(NOOP) is not None:
        return

    @postjob_sa.workflow(name=NOOP)
    def noop(key: int) -> None:
        if _gate is not None:
            _gate.job_started(key)

    @postjob_sa.workflow(name=FAN_PARENT)
    def fan_parent(n: int) -> int:
        global _parent_runs
        _parent_runs += 1
        children = [noop.spawn(i) for i in range(n)]
        for child in children:
            child.result()
        return n


def _session(url: str) -> Any:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    return Session(create_engine(_sa(url), pool_size=1))


def _sa(url: str) -> str:
    """The SQLAlchemy spelling of a libpq URL (the harness hands out libpq ones)."""
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


def _warm(session: Any) -> None:
    """Connect before the clock starts, as the raw floor does (the dialect's first-connect
    queries are not the queue's cost)."""
    from sqlalchemy import text

    session.execute(text("SELECT 1"))
    session.commit()


def _close(session: Any) -> None:
    bind = session.get_bind()
    session.close()
    bind.dispose()


def _api_one(url: str, keys: Sequence[int]) -> float:
    import postjob_sa

    _register()
    s = _session(url)
    _warm(s)
    q = postjob_sa.JobQueue(s)
    t0 = now()
    for k in keys:
        q.enqueue(NOOP, k)
        s.commit()
    elapsed = now() - t0
    _close(s)
    return elapsed


def _api_many(url: str, keys: Sequence[int], batch: int) -> float:
    import postjob_sa

    s = _session(url)
    _warm(s)
    q = postjob_sa.JobQueue(s)
    chunks = [[[k] for k in keys[i : i + batch]] for i in range(0, len(keys), batch)]
    t0 = now()
    for chunk in chunks:
        q.enqueue_many(NOOP, chunk)
        s.commit()
    elapsed = now() - t0
    _close(s)
    return elapsed


def _add_one(url: str, keys: Sequence[int]) -> float:
    from postjob_sa import Job

    s = _session(url)
    _warm(s)
    t0 = now()
    for k in keys:
        s.add(Job(workflow=NOOP, args=[k]))
        s.commit()
    elapsed = now() - t0
    _close(s)
    return elapsed


def _add_many(url: str, keys: Sequence[int], batch: int) -> float:
    from postjob_sa import Job

    s = _session(url)
    _warm(s)
    t0 = now()
    for i in range(0, len(keys), batch):
        s.add_all([Job(workflow=NOOP, args=[k]) for k in keys[i : i + batch]])
        s.commit()
    elapsed = now() - t0
    _close(s)
    return elapsed


class _Producer:
    def __init__(self, url: str) -> None:
        import postjob_sa

        self._s = _session(url)
        _warm(self._s)
        self._q = postjob_sa.JobQueue(self._s)

    def enqueue(self, key: int) -> tuple[float, float]:
        t_call = now()
        self._q.enqueue(NOOP, key)
        self._s.commit()
        return t_call, now()

    def close(self) -> None:
        _close(self._s)


class _RawProducer:
    """Diagnostic (--opt postjob_producer=sql): enqueue with one prepared INSERT in autocommit,
    as the raw floor does, to tell the worker's share of the latency from the Session's."""

    def __init__(self, url: str) -> None:
        import psycopg2

        self._conn = psycopg2.connect(url)
        self._conn.autocommit = True
        self._cur = self._conn.cursor()
        self._cur.execute(
            "PREPARE put (jsonb) AS INSERT INTO postjob.postjobs (workflow, args) "
            "VALUES ('bench.noop', $1)"
        )

    def enqueue(self, key: int) -> tuple[float, float]:
        payload = f"[{int(key)}]"
        t_call = now()
        self._cur.execute("EXECUTE put (%s)", (payload,))
        return t_call, now()

    def close(self) -> None:
        self._conn.close()


class _Probe:
    def __init__(self, url: str) -> None:
        from postjob_sa import _sql
        from postjob_sa._db import Conn

        self._s = _session(url)
        self._conn = Conn.open(self._s.get_bind()).raw
        self._cur = self._conn.cursor()
        self._stmt = _sql.WORKER_CYCLE
        from postjob_sa.worker.executor import outcome_params

        self._params = {
            **outcome_params([]), "worker_id": None,
            "workflows": [NOOP], "versions": [""], "queues": None, "limit": 1, "lease": 60.0,
            # conservative: a worker reaps and makes due what came due now and then, not always
            "reap": True, "promote": True,
        }
        self.table_bytes = int(pg.value(url, "SELECT pg_total_relation_size('postjob.postjobs')"))
        self.index_bytes = int(pg.value(url, "SELECT pg_relation_size('postjob.unfinished_due_idx')"))

    def checkout_one(self) -> bool:
        self._cur.execute(self._stmt, self._params)
        return bool(self._cur.fetchall())

    def explain(self) -> str:
        self._cur.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT u.job_id "
            "FROM postjob.unfinished u WHERE u.workflow = 'bench.noop' "
            "AND u.workflow_version = '' AND u.queue = 'q' AND u.due AND u.lease_token IS NULL "
            "ORDER BY u.priority DESC, u.run_at, u.job_id "
            "LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        return "\n".join(r[0] for r in self._cur.fetchall())

    def close(self) -> None:
        self._conn.close()
        _close(self._s)


class PostjobSA(System):
    name = "postjob_sa"
    is_peer = False
    requires = ("postjob_sa", "sqlalchemy", "psycopg2")
    distributions = ("postjob_sa", "SQLAlchemy", "alembic", "psycopg2-binary")

    def setup(self, url: str) -> None:
        import postjob_sa

        postjob_sa.migrate(_sa(url))

    def reset(self, url: str) -> None:
        pg.execute(
            url,
            "TRUNCATE postjob.postjobs, postjob.tokens RESTART IDENTITY CASCADE",
            "ALTER TABLE postjob.postjobs RESET (autovacuum_enabled)",
        )

    def tables(self, url: str) -> list[str]:
        return ["postjob.postjobs"]

    def job_count(self, url: str) -> int:
        return int(pg.value(url, "SELECT count(*) FROM postjob.postjobs"))

    _producer = "api"

    def enqueue_variants(self, opts: Options) -> list[EnqueueVariant]:
        self._producer = opts.extra.get("postjob_producer", "api")
        return [
            EnqueueVariant("api", one_per_txn=_api_one, batched=_api_many),
            EnqueueVariant("session.add", one_per_txn=_add_one, batched=_add_many),
        ]

    def worker_configs(self, opts: Options) -> list[WorkerConfig]:
        big = int(opts.extra.get("postjob_batch", opts.raw_batch))
        return [
            WorkerConfig("1/txn", {"batch": 1}),
            WorkerConfig(f"{big}/txn", {"batch": big}),
        ]

    def prefill(self, url: str, keys: Sequence[int]) -> None:
        _api_many(url, keys, 1000)

    def work(self, url: str, config: WorkerConfig, gate: Gate) -> None:
        import postjob_sa

        global _gate
        _gate = gate
        _register()
        s = _session(url)
        q = postjob_sa.JobQueue(s, batch_size=int(config.params["batch"]))
        # JobQueue.work()/drain(), with the connections kept open until the driver has read
        # their backends' CPU (gate.ran() blocks until then)
        worker = q._worker(batch=q.batch_size, until_idle=not gate.listening)
        disconnect, worker._disconnect = worker._disconnect, lambda: None  # type: ignore[method-assign]
        worker._connect()  # connected before the driver lists this database's backends
        if gate.listening:
            threading.Thread(target=_stop_on_gate, args=(gate,), daemon=True).start()
        gate.arrive()
        worker.run()
        gate.ran()
        disconnect()
        _close(s)

    def verify_drain(self, url: str, jobs: int) -> DrainCheck:
        counts = dict(
            pg.execute(url, "SELECT status::text, count(*) FROM postjob.postjobs GROUP BY 1")
        )
        return DrainCheck(counts.get("ok", 0) == jobs and sum(counts.values()) == jobs, counts)

    def done_count(self, url: str) -> int:
        return int(pg.value(url, "SELECT count(*) FROM postjob.postjobs WHERE status = 'ok'"))

    def open_producer(self, url: str) -> _Producer | _RawProducer:
        _register()
        if self._producer == "sql":
            return _RawProducer(url)
        return _Producer(url)

    def open_checkout_probe(self, url: str, case: CheckoutCase) -> _Probe:
        self.reset(url)
        ready = (
            "INSERT INTO postjob.postjobs (workflow, args) "
            f"SELECT 'bench.noop', jsonb_build_array(g) FROM generate_series(1, {case.ready}) g"
        )
        if case.vacuumed:
            pg.execute(
                url,
                "INSERT INTO postjob.postjobs (workflow, args, status, next_run_at, results) "
                "SELECT 'bench.noop', '[0]', 'ok', NULL, '[null]' "
                f"FROM generate_series(1, {case.finished})",
                ready,
                "VACUUM ANALYZE postjob.postjobs",
                "CHECKPOINT",
            )
        else:
            pg.execute(
                url,
                "ALTER TABLE postjob.postjobs SET (autovacuum_enabled = false)",
                "INSERT INTO postjob.postjobs (workflow, args, next_run_at) "
                "SELECT 'bench.noop', '[0]', now() - interval '1 day' + g * interval '1 ms' "
                f"FROM generate_series(1, {case.finished}) g",
                "UPDATE postjob.postjobs SET status = 'ok', next_run_at = NULL, results = '[null]'",
                # as a drain settles them: their runnable rows go (dead, unvacuumed)
                "DELETE FROM postjob.unfinished",
                ready,
                "ANALYZE postjob.postjobs",
                "CHECKPOINT",
            )
        return _Probe(url)

    # -- (f) fan-out ----------------------------------------------------------------------------

    def metric_specs(self) -> list[MetricSpec]:
        return [
            MetricSpec("fanout_wall_s", "(f) fan-out of N children: wall time", "s", False),
            MetricSpec("fanout_parent_runs", "(f) fan-out: parent runs", "runs", False),
            MetricSpec("independent_wall_s", "(f) N independent jobs: wall time", "s", False),
            MetricSpec("fanout_vs_independent", "(f) fan-out / independent", "x", False),
        ]

    def extra_metrics(self, url: str, opts: Options, shape: RunShape) -> list[Row]:
        n = int(opts.extra.get("fanout", 1000))
        batch = int(opts.extra.get("fanout_batch", 1))
        config = f"N={n}, W={shape.workers}, batch={batch}"
        rows: list[Row] = []
        fan, runs, indep = [], [], []
        for _ in range(shape.reps):
            wall, parent_runs = _fan_out_run(self, url, n, shape.workers, batch, True)
            fan.append(wall)
            runs.append(parent_runs)
            wall_i, _ = _fan_out_run(self, url, n, shape.workers, batch, False)
            indep.append(wall_i)
        med = sorted(fan)[len(fan) // 2]
        med_i = sorted(indep)[len(indep) // 2]
        rows.append(Row(self.name, config, "fanout_wall_s", med, "s"))
        rows.append(Row(self.name, config, "fanout_parent_runs", max(runs), "runs"))
        rows.append(Row(self.name, config, "independent_wall_s", med_i, "s"))
        rows.append(Row(self.name, config, "fanout_vs_independent", med / med_i, "x"))
        return rows


def _stop_on_gate(gate: Gate) -> None:
    """Listening workers stop the way `postjob run` does: on SIGTERM."""
    while not gate.stopping():
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)


def _fan_worker(url: str, batch: int, root_id: int, go: Any, out: Any) -> None:
    from sqlalchemy import text

    import postjob_sa

    _register()
    s = _session(url)
    q = postjob_sa.JobQueue(s, batch_size=batch)
    go.wait()
    while True:
        q.drain()
        status = s.execute(
            text("SELECT count(*) FROM postjob.postjobs WHERE status <> 'ok'")
        ).scalar_one()
        s.rollback()
        if status == 0:
            break
        time.sleep(0.002)
    out.put(_parent_runs)
    _close(s)


def _fan_out_run(
    system: PostjobSA, url: str, n: int, workers: int, batch: int, fan: bool
) -> tuple[float, int]:
    import postjob_sa

    _register()
    system.reset(url)
    s = _session(url)
    q = postjob_sa.JobQueue(s)
    if fan:
        root_id = q.enqueue(FAN_PARENT, n).id
    else:
        q.enqueue_many(NOOP, [[k] for k in range(n)])
        root_id = 0
    s.commit()
    _close(s)
    go, out = SPAWN.Event(), SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_fan_worker, args=(url, batch, root_id, go, out))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # started and imported
    t0 = now()
    go.set()
    parent_runs = sum(out.get(timeout=300) for _ in procs)
    wall = now() - t0
    for p in procs:
        p.join(timeout=30)
    done = int(pg.value(url, "SELECT count(*) FROM postjob.postjobs WHERE status = 'ok'"))
    expected = n + 1 if fan else n
    if done != expected:
        raise RuntimeError(f"fan-out run incomplete: {done} of {expected} jobs ok")
    return wall, parent_runs
