"""Priorities and queue limits at work: checkout cost and drain throughput.

    .venv/bin/python bench/features.py [--dsn-base postgresql://root@127.0.0.1:5432]
        [--finished 1000000] [--jobs 20000] [--workers 2]

On a database of its own (pjbench_features, recreated), with ``--finished`` finished jobs in
the table throughout:

* **checkout cost**: the median of single checkouts through the worker's prepared cycle (1 job,
  and 100 jobs), on one autocommit connection, in four tables: every job at priority 0; ten
  priority levels in one queue; ten levels across three queues; and the same with 10,000 jobs
  scheduled for tomorrow at a higher priority than every due one (the jobs a naive index
  would walk past);
* **drain throughput**: ``--workers`` processes drain ``--jobs`` no-op jobs of the queue
  ``free`` (batches of 100): once alone; once with the features in use, each job at one of ten
  priorities and with a unique key of its own; and once with those and 2,000 due jobs of a
  queue limited to 2 processing at once beside them (same workflow, due earlier). The figure
  is free jobs per second, from the start until the last free job is ok.

``--part checkout`` or ``--part drain`` runs one half; ``--priority-zero-only`` leaves out what
needs pj0004 (priorities, the limited queue), so the same script measures the code before
pj0004 for comparison. Jobs are due a millisecond apart, as jobs enqueued one by one are;
``--same-time`` gives every job of a fill one timestamp, as one ``enqueue_many`` does (an index
whose key ends with the time then stores the jobs of one timestamp as one entry)::

    git worktree add /tmp/before-pj0004 4bb1493 && cp bench/features.py /tmp/before-pj0004/bench/
    (cd /tmp/before-pj0004 && PYTHONPATH=. ../path/to/.venv/bin/python bench/features.py \
        --priority-zero-only)
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import pg

DB = "pjbench_features"


def _median_us(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _drain(url: str, start: multiprocessing.synchronize.Event) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    import postjob_sa

    postjob_sa.workflow(name="noop")(lambda *a: None)
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    start.wait()
    with Session(engine) as session:
        postjob_sa.JobQueue(session, batch_size=100).work()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--part", choices=("all", "checkout", "drain"), default="all")
    parser.add_argument("--priority-zero-only", action="store_true",
                        help="only what runs on the schema before pj0004 too")
    parser.add_argument("--same-time", action="store_true",
                        help="every job of a fill due at one timestamp")
    opts = parser.parse_args()

    import psycopg2

    import postjob_sa
    from postjob_sa import _sql
    from postjob_sa.worker.executor import outcome_params

    url = pg.fresh_database(opts.dsn_base, DB)
    postjob_sa.migrate(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    conn = psycopg2.connect(url)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(
        "INSERT INTO postjob.postjobs (workflow, status, next_run_at, results) "
        "SELECT 'noop', 'ok', NULL, '[null]' FROM generate_series(1, %s)", (opts.finished,))

    due = "now()" if opts.same_time else "now() - interval '1 hour' + g * interval '1 ms'"

    def fill(ready: int, shape: str) -> None:
        cur.execute("DELETE FROM postjob.postjobs WHERE status <> 'ok'")
        priority, queue = {"zero": ("0", "'default'"), "levels": ("g %% 10", "'default'")}.get(
            shape, ("g %% 10", "'q' || (g %% 3)"))
        cur.execute(
            f"INSERT INTO postjob.postjobs (workflow, args, next_run_at"
            f"{', priority, queue' if shape != 'zero' else ''}) "
            f"SELECT 'noop', jsonb_build_array(g), {due}"
            f"{f', {priority}, {queue}' if shape != 'zero' else ''} "
            "FROM generate_series(1, %s) g", (ready,))
        if shape == "future":
            cur.execute(
                "INSERT INTO postjob.postjobs (workflow, priority, next_run_at) "
                "SELECT 'noop', 100, now() + interval '1 day' FROM generate_series(1, 10000)")
        cur.execute("VACUUM ANALYZE postjob.postjobs")
        cur.execute("VACUUM ANALYZE postjob.unfinished")

    def checkout(limit: int) -> None:
        cur.execute(_sql.WORKER_CYCLE, {
            **outcome_params([]), "worker_id": None,
            "workflows": ["noop"], "versions": [""], "queues": None, "limit": limit,
            "lease": 60.0, "reap": False, "promote": False})
        cur.fetchall()

    results: dict[str, float] = {}
    shapes = {"zero": "priority 0 only", "levels": "10 priorities, 1 queue",
              "queues": "10 priorities, 3 queues", "future": "... and 10,000 for tomorrow"}
    for shape, label in shapes.items():
        if opts.part == "drain" or (opts.priority_zero_only and shape != "zero"):
            break
        fill(5000, shape)
        results[f"checkout 1 job, {label} (us)"] = _median_us(lambda: checkout(1), 2000)
        fill(40000, shape)
        results[f"checkout 100 jobs, {label} (us)"] = _median_us(lambda: checkout(100), 200)

    ctx = multiprocessing.get_context("spawn")
    drains = {"plain": "alone", "keyed": "with 10 priorities and unique keys",
              "beside": "with 10 priorities, unique keys and a limited queue beside"}
    for config, label in drains.items():
        if opts.part == "checkout" or (opts.priority_zero_only and config != "plain"):
            break
        beside = config == "beside"
        cur.execute("DELETE FROM postjob.postjobs WHERE status <> 'ok'")
        cur.execute("DELETE FROM postjob.queue_limits")
        if beside:
            cur.execute("INSERT INTO postjob.queue_limits (queue, concurrency) VALUES ('limited', 2)")
            cur.execute(
                "INSERT INTO postjob.postjobs (workflow, queue, next_run_at) "
                "SELECT 'noop', 'limited', now() - interval '1 minute' "
                "FROM generate_series(1, 2000)")
        keyed = ", g %% 10, 'key-' || g" if config != "plain" else ""
        cur.execute(
            "INSERT INTO postjob.postjobs (workflow, queue, args, next_run_at"
            f"{', priority, unique_key' if keyed else ''}) "
            f"SELECT 'noop', 'free', jsonb_build_array(g), {due}{keyed} "
            "FROM generate_series(1, %s) g", (opts.jobs,))
        cur.execute("VACUUM ANALYZE postjob.postjobs")
        cur.execute("VACUUM ANALYZE postjob.unfinished")
        start = ctx.Event()
        procs = [ctx.Process(target=_drain, args=(url, start)) for _ in range(opts.workers)]
        for p in procs:
            p.start()
        time.sleep(2.0)  # imports and connections, untimed
        t0 = time.perf_counter()
        start.set()
        while True:
            # the narrow tables of unfinished work only: a scan of the finished jobs here
            # (a parallel seq scan of 1,000,000 rows, ~100 ms on three cores) took the CPU
            # the workers were being measured on
            cur.execute(
                "SELECT count(*) FROM postjob.unfinished WHERE queue = 'free'")
            if cur.fetchone()[0] == 0:  # type: ignore[index]
                break
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.terminate()
            p.join()
        results[f"drain of {opts.jobs} free jobs, {label} (jobs/s)"] = opts.jobs / elapsed
    conn.close()
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
