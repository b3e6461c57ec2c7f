#!/usr/bin/env python3
"""Two figures of issue 11 ("trust at the edges"), measured on this machine.

1. Checkout cost beside jobs this worker cannot run: one worker cycle (record nothing,
   check out one job) and one idle check (``worker_idle``: seconds to the next job), timed one
   call at a time, with 100 due jobs of the worker's workflow and nothing else, then beside
   100,000 waiting manual steps, then beside 100,000 due jobs of a workflow it does not run.
   For comparison, pj0001's candidate scan (one range of the runnable index, walked with a
   filter) on the same tables.
2. An idle worker's transactions per second while another transaction holds the row of a due
   job, for 5 s: this code, and (``--old-tree DIR``, a checkout of the code before issue 11)
   the old one.

    .venv/bin/python bench/edges.py [--old-tree /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != BENCH_DIR]
sys.path.insert(0, REPO_ROOT)

from bench.harness import pg  # noqa: E402

CYCLE = (
    "SELECT id FROM postjob.checkout_v4(NULL, 'bench', ARRAY['w'], ARRAY[''], NULL, 1, 60, "
    "false, false, false)"
)
IDLE = "SELECT postjob.worker_idle_v2(NULL, ARRAY['w'], ARRAY[''], NULL, false)"
#: pj0001's candidate scan of postjob.checkout (for comparison; rolled back)
OLD_SCAN = (
    "SELECT s.id FROM postjob.postjobs s WHERE s.status IN ('ready', 'err') "
    "AND s.next_run_at <= statement_timestamp() "
    "AND (s.timing_out_at IS NULL OR s.timing_out_at > statement_timestamp()) "
    "AND EXISTS (SELECT 1 FROM unnest(ARRAY['w'], ARRAY['']) AS w(name, version) "
    "WHERE w.name = s.workflow AND (s.workflow_version = '' OR s.workflow_version = w.version)) "
    "ORDER BY s.next_run_at LIMIT 1 FOR UPDATE SKIP LOCKED"
)
BESIDE = {
    "nothing else": None,
    "100,000 waiting manual steps": (
        "INSERT INTO postjob.postjobs (workflow, args, max_attempts) "
        "SELECT '__manual__', jsonb_build_array('approve', g), 1 FROM generate_series(1, 100000) g"
    ),
    "100,000 due jobs of another workflow": (
        "INSERT INTO postjob.postjobs (workflow, next_run_at) "
        "SELECT 'other', now() - interval '1 hour' FROM generate_series(1, 100000)"
    ),
}


def _median_us(conn: Any, sql: str, n: int, rollback: bool = False) -> float:
    times = []
    with conn.cursor() as cur:
        for _ in range(n):
            t0 = time.perf_counter()
            cur.execute(sql)
            cur.fetchall()
            times.append(time.perf_counter() - t0)
            if rollback:
                conn.rollback()
    return statistics.median(times) * 1e6


def checkout_costs(base: str, calls: int, rounds: int) -> list[tuple[str, float, float, float]]:
    """Median per case over ``rounds`` rounds that take the cases in turn (a load that drifts
    during the run weighs on every case alike)."""
    import psycopg2

    import postjob_sa

    url = pg.fresh_database(base, "pjbench_edges")
    postjob_sa.migrate(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    seen: dict[str, list[tuple[float, float, float]]] = {label: [] for label in BESIDE}
    for _ in range(rounds):
        for label, extra in BESIDE.items():
            statements = ["TRUNCATE postjob.postjobs, postjob.tokens, postjob.workers CASCADE"]
            statements += [extra] if extra else []
            # enough due jobs of the worker's own that the timed checkouts never run out
            statements.append("INSERT INTO postjob.postjobs (workflow) "
                              f"SELECT 'w' FROM generate_series(1, {calls + 100})")
            pg.execute(url, *statements, "VACUUM ANALYZE postjob.postjobs")
            conn = psycopg2.connect(url)
            conn.autocommit = True
            _median_us(conn, CYCLE, 20)  # plans made and cached
            cycle = _median_us(conn, CYCLE, calls)
            idle = _median_us(conn, IDLE, calls)
            conn.autocommit = False
            old = _median_us(conn, OLD_SCAN, calls, rollback=True)
            conn.close()
            seen[label].append((cycle, idle, old))
    return [(label, *(statistics.median(r[i] for r in runs) for i in range(3)))  # type: ignore[misc]
            for label, runs in seen.items()]


IDLE_WORKER = """
import sys, time, threading
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
import postjob_sa
reg = postjob_sa.Registry()
postjob_sa.workflow(name="w", registry=reg)(lambda: None)
engine = create_engine(sys.argv[1])
def work():
    with Session(engine) as s:
        postjob_sa.JobQueue(s, registry=reg).work(count=1)
threading.Thread(target=work, daemon=True).start()
time.sleep(float(sys.argv[2]))
"""


def idle_rate(base: str, tree: str, seconds: float) -> float:
    """Transactions per second of the database while only an idle worker (of the code in
    ``tree``) runs beside a transaction that holds the row of the one due job."""
    import psycopg2

    import postjob_sa

    url = pg.fresh_database(base, "pjbench_idle")
    sa_url = url.replace("postgresql://", "postgresql+psycopg2://", 1)
    env = {**os.environ, "PYTHONPATH": tree}
    subprocess.run([sys.executable, "-c", "import sys, postjob_sa; postjob_sa.migrate(sys.argv[1])",
                    sa_url], env=env, check=True, cwd=tree)
    del postjob_sa
    pg.execute(url, "INSERT INTO postjob.postjobs (workflow) VALUES ('w')")
    holder = psycopg2.connect(url)
    with holder.cursor() as cur:
        cur.execute("SELECT 1 FROM postjob.postjobs FOR UPDATE")
    worker = subprocess.Popen([sys.executable, "-c", IDLE_WORKER, sa_url, str(seconds + 2)],
                              env=env, cwd=tree)
    time.sleep(1.5)  # started, idle
    before = pg.transactions_after_quiet(url, 1.1)
    time.sleep(seconds)
    worker.kill()  # its backends exit and flush their statistics
    worker.wait()
    time.sleep(0.5)
    after = pg.transactions_after_quiet(url, 1.1)
    holder.rollback()
    holder.close()
    return (after - before) / seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--old-tree", help="a checkout of the code before issue 11 (for item 7)")
    p.add_argument("--dsn-base", default=os.environ.get("PJBENCH_DSN_BASE", "postgresql://root@127.0.0.1:5432"))
    opts = p.parse_args()

    rows = checkout_costs(opts.dsn_base, opts.calls, opts.rounds)
    base_cycle, base_idle = rows[0][1], rows[0][2]
    print(f"1. checkout cost beside jobs this worker cannot run (medians of {opts.calls} calls, "
          f"median of {opts.rounds} rounds)\n")
    print("| beside | worker cycle (checkout 1) | idle check | ratio to nothing else | pj0001 scan |")
    print("|---|---:|---:|---:|---:|")
    for label, cycle, idle, old in rows:
        ratio = max(cycle / base_cycle, idle / base_idle)
        print(f"| {label} | {cycle:,.0f} µs | {idle:,.0f} µs | {ratio:.2f}× | {old:,.0f} µs |")
    print(f"\n2. an idle worker beside a transaction holding a due job's row ({opts.seconds:g} s)\n")
    print("| code | transactions/s |")
    print("|---|---:|")
    print(f"| this | {idle_rate(opts.dsn_base, REPO_ROOT, opts.seconds):,.1f} |", flush=True)
    if opts.old_tree:
        print(f"| {opts.old_tree} | {idle_rate(opts.dsn_base, opts.old_tree, opts.seconds):,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
