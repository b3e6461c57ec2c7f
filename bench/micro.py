"""Micro-benchmarks of postjob_sa's hot statements beside their floors, interleaved call by call.

    .venv-bench/bin/python bench/micro.py [--dsn-base postgresql://root@127.0.0.1:5432] [--rounds N]

Each figure is the median of many single calls (so it includes the round trips and the
commit), on a database of its own (pjbench_micro, recreated). Pairs that are compared are
timed interleaved: one call of each in turn, so the drift of a busy machine hits both alike.

* enqueue + commit through a Session (``JobQueue.enqueue``), beside a bare Session INSERT of
  one row into a table of one jsonb column + commit: the ceiling of any one-job-per-transaction
  enqueue through a Session (BEGIN, one INSERT, COMMIT);
* ``enqueue_many`` of 1,000 + commit, beside the raw floor's batched insert (one
  ``INSERT ... SELECT unnest($1::jsonb[])`` into a bare queue table, prepared, in autocommit);
* checkout of 1 job and of 100 through the worker's cycle statement, beside a prepared
  single-row ``UPDATE ... SKIP LOCKED`` on a bare queue table;
* recording 100 outcomes through the worker's cycle statement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import pg

DB = "pjbench_micro"


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """The median µs of each call, the calls taken in turn, ``rounds`` times."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(_timed(fn))
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    parser.add_argument("--rounds", type=int, default=2000)
    opts = parser.parse_args()

    import psycopg2
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    import postjob_sa
    from postjob_sa import _sql
    from postjob_sa.worker.executor import Outcome, outcome_params

    url = pg.fresh_database(opts.dsn_base, DB)
    postjob_sa.migrate(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    conn = psycopg2.connect(url)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("CREATE TABLE floor_jobs (id bigserial PRIMARY KEY, status text NOT NULL "
                "DEFAULT 'ready', run_at timestamptz NOT NULL DEFAULT now(), "
                "args jsonb NOT NULL DEFAULT '{}')")
    cur.execute("CREATE INDEX floor_jobs_runnable ON floor_jobs (run_at) WHERE status = 'ready'")
    cur.execute("CREATE TABLE micro_floor (v jsonb)")
    cur.execute("PREPARE floor_take AS UPDATE floor_jobs SET status = 'processing' WHERE id = "
                "(SELECT id FROM floor_jobs WHERE status = 'ready' AND run_at <= now() "
                "ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, args")
    cur.execute("PREPARE floor_put (jsonb[]) AS INSERT INTO floor_jobs (args) "
                "SELECT unnest($1)")

    def fill(ready: int) -> None:
        cur.execute("TRUNCATE postjob.postjobs, postjob.tokens, floor_jobs RESTART IDENTITY CASCADE")
        cur.execute("INSERT INTO postjob.postjobs (workflow, args) "
                    "SELECT 'noop', jsonb_build_array(g) FROM generate_series(1, %s) g", (ready,))
        cur.execute("INSERT INTO floor_jobs (args) SELECT jsonb_build_array(g) "
                    "FROM generate_series(1, %s) g", (ready,))
        cur.execute("VACUUM ANALYZE postjob.postjobs, postjob.unfinished, floor_jobs")

    base: dict[str, Any] = {"worker_id": None, "workflows": ["noop"], "versions": [""],
                            "queues": None, "lease": 60.0, "reap": False, "promote": False}

    def checkout(limit: int) -> list[tuple[Any, ...]]:
        cur.execute(_sql.WORKER_CYCLE, {**base, **outcome_params([]), "limit": limit})
        return [r for r in cur.fetchall() if r[0] == "job"]

    results: dict[str, float] = {}
    fill(opts.rounds + 10)
    results |= {f"checkout 1 job: {k} (us)": v for k, v in interleaved({
        "postjob_sa": lambda: checkout(1),
        "floor, prepared single-row UPDATE": lambda: cur.execute("EXECUTE floor_take"),
    }, opts.rounds).items()}
    fill(100 * 210)
    results["checkout 100 jobs (us)"] = interleaved({"c": lambda: checkout(100)}, 200)["c"]
    fill(100 * 210)
    batches = iter([checkout(100) for _ in range(200)])

    def finish() -> None:
        rows = next(batches)
        outcomes = [Outcome(r[1], r[2], "ok", result="[null]") for r in rows]
        cur.execute(_sql.WORKER_CYCLE, {**base, **outcome_params(outcomes), "limit": 0})

    results["finish of 100 outcomes (us)"] = interleaved({"f": finish}, 200)["f"]
    results["SELECT 1 (us)"] = interleaved({"s": lambda: cur.execute("SELECT 1")}, 2000)["s"]

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with Session(engine) as session:
        q = postjob_sa.JobQueue(session)
        counter = iter(range(10**9))
        floor = text("INSERT INTO micro_floor (v) VALUES (CAST(:v AS jsonb))")

        def enqueue() -> None:
            q.enqueue("noop", next(counter))
            session.commit()

        def session_floor() -> None:
            session.execute(floor, {"v": "[1]"})
            session.commit()

        for _ in range(50):  # warm both: the dialect's first statements are not the cost
            enqueue()
            session_floor()
        results |= {f"one per transaction through a Session: {k} (us)": v for k, v in interleaved(
            {"enqueue + commit": enqueue, "floor, bare INSERT + commit": session_floor},
            opts.rounds).items()}

        payload = [f"[{k}]" for k in range(1000)]

        def enqueue_many() -> None:
            q.enqueue_many("noop", [[k] for k in range(1000)])
            session.commit()

        results |= {f"1,000 jobs in one transaction: {k} (us)": v for k, v in interleaved({
            "enqueue_many + commit": enqueue_many,
            "floor, prepared INSERT ... unnest": lambda: cur.execute("EXECUTE floor_put (%s::jsonb[])",
                                                                    (payload,)),
        }, 100).items()}
    engine.dispose()
    conn.close()
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:10.0f}")
    ratios = {
        "enqueue vs the Session floor": results[
            "one per transaction through a Session: floor, bare INSERT + commit (us)"]
        / results["one per transaction through a Session: enqueue + commit (us)"],
        "enqueue_many vs the raw batched insert": results[
            "1,000 jobs in one transaction: floor, prepared INSERT ... unnest (us)"]
        / results["1,000 jobs in one transaction: enqueue_many + commit (us)"],
        "checkout of 1 vs the single-row UPDATE": results[
            "checkout 1 job: floor, prepared single-row UPDATE (us)"]
        / results["checkout 1 job: postjob_sa (us)"],
    }
    for key, value in ratios.items():
        print(f"{key:<{width}}  {value:10.2f}x")
    print(json.dumps({**results, **{f"ratio: {k}": v for k, v in ratios.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
