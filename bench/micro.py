"""Micro-benchmarks of postjob_sa's hot statements, for profiling a lever in isolation.

    .venv-bench/bin/python bench/micro.py [--dsn-base postgresql://root@127.0.0.1:5432]

Each figure is the median of many single calls on one autocommit connection (so it includes
the round trip and the commit), on a database of its own (pjbench_micro, recreated):

* checkout of 1 job through the worker's prepared statement, and of 100;
* recording 100 outcomes (finish_jobs_v3, through the worker's cycle);
* the enqueue API, one job per transaction through a Session, and enqueue_many of 1,000;
* for scale: a prepared single-row UPDATE ... SKIP LOCKED on the same table and SELECT 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import pg

DB = "pjbench_micro"


def _median_us(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    opts = parser.parse_args()

    import psycopg2
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    import postjob_sa
    from postjob_sa import _sql
    from postjob_sa.worker.executor import Outcome, outcome_params

    url = pg.fresh_database(opts.dsn_base, DB)
    postjob_sa.migrate(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    conn = psycopg2.connect(url)
    conn.autocommit = True
    cur = conn.cursor()

    def fill(ready: int) -> None:
        cur.execute("TRUNCATE postjob.postjobs, postjob.tokens RESTART IDENTITY CASCADE")
        cur.execute(
            "INSERT INTO postjob.postjobs (workflow, args) "
            "SELECT 'noop', jsonb_build_array(g) FROM generate_series(1, %s) g",
            (ready,),
        )
        cur.execute("VACUUM ANALYZE postjob.postjobs")

    base = {"worker_id": None, "identifier": "bench", "done": "{}", "workflows": ["noop"],
            "versions": [""], "queues": None, "lease": 60.0, "reap": False, "promote": False}

    def checkout(limit: int) -> list[tuple[object, ...]]:
        cur.execute(_sql.WORKER_CYCLE, {**base, **outcome_params([]), "limit": limit})
        return [r for r in cur.fetchall() if r[0] == "job"]

    results: dict[str, float] = {}
    fill(5000)
    results["checkout 1 job (us)"] = _median_us(lambda: checkout(1), 2000)
    fill(40000)
    results["checkout 100 jobs (us)"] = _median_us(lambda: checkout(100), 200)

    fill(40000)
    batches = [checkout(100) for _ in range(200)]
    it = iter(batches)

    def finish() -> None:
        rows = next(it)
        outcomes = [Outcome(r[1], r[2], "ok", result="[null]") for r in rows]  # type: ignore[arg-type]
        cur.execute(_sql.WORKER_CYCLE, {**base, **outcome_params(outcomes), "limit": 0,
                                        "done": "{" + str(rows[0][2]) + "}"})  # finish only

    results["finish of 100 outcomes (us)"] = _median_us(finish, 200)

    cur.execute("CREATE TABLE IF NOT EXISTS floor_jobs (id bigserial PRIMARY KEY, "
                "status text NOT NULL DEFAULT 'ready', run_at timestamptz NOT NULL DEFAULT now(), "
                "args jsonb NOT NULL DEFAULT '{}')")
    cur.execute("CREATE INDEX IF NOT EXISTS floor_jobs_runnable ON floor_jobs (run_at) "
                "WHERE status = 'ready'")
    cur.execute("TRUNCATE floor_jobs")
    cur.execute("INSERT INTO floor_jobs (args) SELECT jsonb_build_array(g) "
                "FROM generate_series(1, 5000) g")
    cur.execute("VACUUM ANALYZE floor_jobs")
    cur.execute(
        "PREPARE floor AS UPDATE floor_jobs SET status = 'processing' WHERE id = (SELECT id "
        "FROM floor_jobs WHERE status = 'ready' AND run_at <= now() ORDER BY run_at LIMIT 1 "
        "FOR UPDATE SKIP LOCKED) RETURNING id, args"
    )
    results["floor: prepared single-row UPDATE (us)"] = _median_us(
        lambda: cur.execute("EXECUTE floor"), 2000
    )
    results["SELECT 1 (us)"] = _median_us(lambda: cur.execute("SELECT 1"), 2000)

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with Session(engine) as session:
        q = postjob_sa.JobQueue(session)
        counter = iter(range(10**9))

        def enqueue() -> None:
            q.enqueue("noop", next(counter))
            session.commit()

        results["enqueue + commit through a Session (us)"] = _median_us(enqueue, 2000)

        # the ceiling of any one-job-per-transaction enqueue through a Session: BEGIN, one
        # INSERT into a bare table, COMMIT (three round trips; the raw floor's is one)
        from sqlalchemy import text

        session.execute(text("CREATE TABLE IF NOT EXISTS micro_floor (v jsonb)"))
        session.commit()
        floor = text("INSERT INTO micro_floor (v) VALUES (CAST(:v AS jsonb))")

        def session_floor() -> None:
            session.execute(floor, {"v": "[1]"})
            session.commit()

        results["floor: INSERT + commit through a Session (us)"] = _median_us(session_floor, 2000)

        def enqueue_many() -> None:
            q.enqueue_many("noop", [[k] for k in range(1000)])
            session.commit()

        results["enqueue_many of 1,000 + commit (us)"] = _median_us(enqueue_many, 50)
    engine.dispose()
    conn.close()
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:10.0f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
