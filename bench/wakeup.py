"""Idle wake-up: how long a job waits for an idle worker, and what each wake-up costs.

    .venv/bin/python bench/wakeup.py [--workers 2,16,64] [--jobs 60] [--spacing 0.15]

For each number of idle worker processes, two ways to run them:

- ``supervisor``: ``postjob run --processes N`` (the supervisor listens and wakes one child);
- ``listen``: N independent ``postjob run`` processes, each LISTENing on a channel of its own
  (a new job wakes the one that has waited longest);
- ``queues``: N independent processes, one per queue (``--queue q0`` ... ``--queue qN-1``, as
  docs/operations.md recommends), the jobs spread over the queues in turn: a job must wake
  the worker of its queue, so the latency should be that of ``listen`` with one worker.

Each job is committed alone, ``--spacing`` seconds after the previous one, while every worker
is idle; the job's body (bench/fleet_app.py) notes CLOCK_MONOTONIC when it starts. Latency is enqueue commit ->
job start (p50/p99). Server CPU is the utime+stime of the database's backends over the
measured phase, per job (= per wake-up); workers' CPU likewise for the worker processes.
The database ``pjbench_wakeup`` is dropped and created again.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2

from bench.harness import fleet, pg
from bench.harness.measure import now, percentile

DB = "pjbench_wakeup"


def measure(url: str, workers: int, mode: str, jobs: int, spacing: float) -> dict[str, float]:
    fleet.reset(url)
    group = fleet.Fleet(url)
    try:
        if mode == "supervisor":
            group.start("--processes", str(workers))
        elif mode == "queues":
            for n in range(workers):
                group.start("--queue", f"q{n}")
        else:
            for _ in range(workers):
                group.start()
        fleet.wait_for(lambda: pg.value(url, fleet.IDLE_WORKERS) >= workers, 300,
                       f"{workers} idle workers", group.check_alive)
        conn = psycopg2.connect(url)
        commits: dict[int, float] = {}
        try:
            for i in range(3 + jobs):  # three to warm up
                if i == 3:
                    server_pids = pg.backend_pids(url)
                    worker_pids = group.pids()
                    cpu0 = fleet.cpu_seconds(server_pids), fleet.cpu_seconds(worker_pids)
                queue = f"q{i % workers}" if mode == "queues" else "q"
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO postjob.postjobs (workflow, args, queue) "
                                "VALUES ('bench.record', '[0]', %s) RETURNING id", (queue,))
                    job_id = cur.fetchone()[0]  # type: ignore[index]
                conn.commit()
                commits[job_id] = now()
                time.sleep(spacing)
            fleet.wait_for(lambda: len(group.runs()) == 3 + jobs, 60, "every job started",
                           group.check_alive)
            cpu1 = fleet.cpu_seconds(server_pids), fleet.cpu_seconds(worker_pids)
        finally:
            conn.close()
        starts = dict(group.runs())
        waits = [(starts[i] - commits[i]) * 1000 for i in sorted(commits)[3:]]
        return {"p50": percentile(waits, 50), "p99": percentile(waits, 99),
                "server_ms": (cpu1[0] - cpu0[0]) * 1000 / jobs,
                "workers_ms": (cpu1[1] - cpu0[1]) * 1000 / jobs}
    finally:
        group.stop()
        group.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="2,16,64")
    parser.add_argument("--modes", default="supervisor,listen",
                        help="supervisor, listen, queues (comma separated)")
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--spacing", type=float, default=0.15)
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    args = parser.parse_args()
    url = fleet.fresh_queue_database(args.dsn_base, DB)
    rows = []
    for mode in args.modes.split(","):
        for n in (int(w) for w in args.workers.split(",")):
            print(f"{mode}: {n} idle workers ...", file=sys.stderr, flush=True)
            rows.append((n, mode, measure(url, n, mode, args.jobs, args.spacing)))
    print("| idle workers | how | p50 ms | p99 ms | server CPU ms/wake-up | workers' CPU ms/wake-up |")
    print("|---:|---|---:|---:|---:|---:|")
    for n, mode, r in rows:
        print(f"| {n} | {mode} | {r['p50']:.1f} | {r['p99']:.1f} | {r['server_ms']:.2f} | "
              f"{r['workers_ms']:.2f} |")
    for mode in args.modes.split(","):
        p99 = {n: r["p99"] for n, m, r in rows if m == mode}
        if len(p99) > 1:
            low, high = min(p99), max(p99)
            print(f"\n{mode}: p99 at {high} workers is {p99[high] / p99[low]:.1f}x p99 at {low}")


if __name__ == "__main__":
    main()
