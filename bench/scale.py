"""Many workers on one PostgreSQL: throughput, exactly-once, and the server connections used.

    .venv/bin/python bench/scale.py [--jobs 6000] [--hosts 4] [--processes 16]
                                    [--jobs-per-process 1] [--pool-size 20]

Runs the same load three times, each on a fresh queue: 2 worker processes (one supervisor,
the baseline), then ``--hosts`` supervisors of ``--processes`` processes each ("as if on
several hosts") connected directly, then the same through a PgBouncer in transaction mode
(``--pooled``, wake-ups on one direct connection per supervisor). The jobs (``bench.record``:
one line per run in a file of its process, see bench/fleet_app.py) are enqueued in
transactions of 500 while the workers run. Reported: jobs/s from the first commit to the last
job done, against the baseline; every job run exactly once (from those lines); the peak of
the database's server connections (``pg_stat_activity``) and, through PgBouncer, of its server
connections (``SHOW POOLS``). The database ``pjbench_scale`` is dropped and created again.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2
from sqlalchemy.engine import make_url

from bench.harness import fleet, pg
from tests.pgbouncer import PgBouncer

DB = "pjbench_scale"
CHUNK = 500
BACKENDS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"


def run(url: str, jobs: int, hosts: int, processes: int, per_process: int,
        bouncer: PgBouncer | None) -> dict[str, float]:
    fleet.reset(url)
    work_url = url if bouncer is None else bouncer.libpq_url(DB)
    group = fleet.Fleet(work_url)
    extra = [] if bouncer is None else ["--pooled", "--wakeup-url", url]
    peaks = {"direct": 0, "pooled": 0}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.2):
            peaks["direct"] = max(peaks["direct"], int(pg.value(url, BACKENDS)) - 1)
            if bouncer is not None:
                pools = [p for p in bouncer.show("POOLS") if p["database"] == DB]
                peaks["pooled"] = max(peaks["pooled"], sum(
                    int(p[k]) for p in pools for k in ("sv_active", "sv_idle", "sv_used")))  # type: ignore[call-overload]

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        for _ in range(hosts):
            group.start("--processes", str(processes), "--jobs-per-process", str(per_process),
                        *extra)
        fleet.wait_for(lambda: pg.value(url, "SELECT count(*) FROM postjob.workers")
                       == hosts * processes, 600, "every worker registered", group.check_alive)
        sampler.start()
        conn = psycopg2.connect(url)
        try:
            began = time.monotonic()
            for chunk in range(0, jobs, CHUNK):
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO postjob.postjobs (workflow, args) SELECT "
                                "'bench.record', jsonb_build_array(g) FROM generate_series(%s, %s) g",
                                (chunk, min(chunk + CHUNK, jobs) - 1))
                conn.commit()
        finally:
            conn.close()
        fleet.wait_for(lambda: pg.value(url, "SELECT count(*) FROM postjob.postjobs "
                                             "WHERE status = 'ok'") == jobs,
                       900, f"{jobs} jobs done", group.check_alive)
        took = time.monotonic() - began
    finally:
        sampling.set()
        group.stop()
    counts = Counter(job_id for job_id, _ in group.runs())
    group.close()
    once = len(counts) == jobs and set(counts.values()) == {1}
    return {"rate": jobs / took, "once": once, **peaks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=6000)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--jobs-per-process", type=int, default=1)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    args = parser.parse_args()
    url = fleet.fresh_queue_database(args.dsn_base, DB)
    rows = []
    with PgBouncer(make_url(url), pool_size=args.pool_size, strict=False) as bouncer:
        for label, hosts, procs, route in (
            ("baseline", 1, 2, None),
            ("direct", args.hosts, args.processes, None),
            ("PgBouncer", args.hosts, args.processes, bouncer),
        ):
            print(f"{label}: {hosts} x {procs} processes ...", file=sys.stderr, flush=True)
            rows.append((label, hosts, procs, run(url, args.jobs, hosts, procs,
                                                  args.jobs_per_process, route)))
    base = rows[0][3]["rate"]
    print(f"{args.jobs} jobs, {args.jobs_per_process} job(s) at once per process\n")
    print("| route | supervisors x processes | jobs/s | vs 2 workers | every job once | "
          "server connections (peak) | through PgBouncer (peak) |")
    print("|---|---|---:|---:|---|---:|---:|")
    for label, hosts, procs, r in rows:
        pooled = f"{r['pooled']:.0f}" if label == "PgBouncer" else "-"
        print(f"| {label} | {hosts} x {procs} | {r['rate']:.0f} | {r['rate'] / base:.2f}x | "
              f"{'yes' if r['once'] else 'NO'} | {r['direct']:.0f} | {pooled} |")


if __name__ == "__main__":
    main()
