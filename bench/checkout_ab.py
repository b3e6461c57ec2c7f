"""Checkout cost of several versions of the code, interleaved call by call.

    .venv/bin/python bench/checkout_ab.py before=/tmp/before-pj0004 pj0004=/tmp/pj0004 now=.
        [--dsn-base postgresql://root@127.0.0.1:5432] [--finished 1000000] [--calls 1500]
        [--vacuum-every N] [--shapes zero,levels,...] [--same-jobs]

Each NAME=TREE is a checkout of this repository (``git worktree add /tmp/pj0004 <commit>``):
its own schema is installed by its own code into a database of its own (pjbench_ab_NAME), with
``--finished`` finished jobs in the table. Then, for each table shape (as in bench/features.py:
priority 0 only; ten priorities in one queue; ten priorities across three queues; the same
with 10,000 jobs for tomorrow at a higher priority; priority 0 in four workflows the worker
serves) and batch size (1 and 100), every database gets the same fill and the checkouts go
round robin, one call per database in turn, through the worker's cycle statement (each tree's own:
checkout_v4 since pj0009, worker_cycle_v3 in pj0008, worker_cycle before). Interleaving cancels the drift of a busy machine that separate
runs, minutes apart, do not. Trees whose schema has no priorities (before pj0004) take part in
the priority 0 shapes only, or, with ``--same-jobs``, in every shape on the same jobs without
their priorities. Nothing vacuums between calls unless ``--vacuum-every`` says so (then outside
the timing). Prints the median per version and its ratio to the first version given.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import pg

SHAPES = {
    "zero": "priority 0 only",
    "levels": "10 priorities, 1 queue",
    "queues": "10 priorities, 3 queues",
    "future": "... and 10,000 for tomorrow",
    "pairs": "priority 0, 4 workflows",
}

#: the workflows a worker serves in each shape (its cycle is given all of them)
WORKFLOWS = {"pairs": "ARRAY['noop', 'noop1', 'noop2', 'noop3']::text[], "
                      "ARRAY['', '', '', '']::text[]"}

#: the cycle statement of each generation of the schema, newest first: the function the tree's
#: worker calls (found by name), given no outcomes, no reaping and nothing made due
CYCLES = (
    ("checkout_v4",
     "SELECT id FROM postjob.checkout_v4(NULL::bigint, 'bench'::varchar, {workflows}, "
     "NULL::text[], %(limit)s::integer, 60::float8, false, false, false)"),
    ("worker_cycle_v3",
     "SELECT kind, id FROM postjob.worker_cycle_v3(NULL::bigint, 'bench'::varchar, "
     "'{}'::bigint[], '{}'::bigint[], '{}'::jsonb[], '{}'::text[], '[]'::jsonb, "
     "'{}'::bigint[], {workflows}, NULL::text[], %(limit)s::integer, 60::float8, false, false)"),
    ("worker_cycle",
     "SELECT kind, id FROM postjob.worker_cycle(NULL::bigint, 'bench'::varchar, '{}'::bigint[], "
     "'{}'::bigint[], '{}'::text[], '{}'::jsonb[], '{}'::text[], '{}'::text[], '{}'::jsonb[], "
     "'{}'::text[], '{}'::bigint[], {workflows}, NULL::text[], "
     "%(limit)s::integer, 60::float8, false, false)"),
)


def _cycle(cur: Any) -> str:
    """The cycle statement of the schema this cursor's database holds."""
    for name, statement in CYCLES:
        cur.execute("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "WHERE n.nspname = 'postjob' AND p.proname = %s", (name,))
        if cur.fetchone()[0]:
            return statement
    raise SystemExit("no worker cycle function in this schema")


def _install(tree: Path, url: str) -> None:
    code = ("import sys, postjob_sa; "
            "postjob_sa.migrate(sys.argv[1].replace('postgresql://', 'postgresql+psycopg2://', 1))")
    subprocess.run([sys.executable, "-c", code, url], cwd=tree, check=True,
                   env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def _fill(cur: Any, ready: int, shape: str, priorities: bool = True) -> None:
    """The shape's jobs; a schema without priorities gets the same jobs without them."""
    cur.execute("DELETE FROM postjob.postjobs WHERE status <> 'ok'")
    due = "now() - interval '1 hour' + g * interval '1 ms'"
    if shape == "pairs":  # one backlog of four workflows (a worker serves all it knows)
        cur.execute("INSERT INTO postjob.postjobs (workflow, args, next_run_at) "
                    "SELECT CASE g %% 4 WHEN 0 THEN 'noop' ELSE 'noop' || g %% 4 END, "
                    f"jsonb_build_array(g), {due} FROM generate_series(1, %s) g", (ready,))
    elif shape == "zero":
        cur.execute("INSERT INTO postjob.postjobs (workflow, args, next_run_at) "
                    f"SELECT 'noop', jsonb_build_array(g), {due} FROM generate_series(1, %s) g",
                    (ready,))
    else:
        queue = "'default'" if shape == "levels" else "'q' || (g %% 3)"
        level = ", priority" if priorities else ""
        value = ", g %% 10" if priorities else ""
        cur.execute(f"INSERT INTO postjob.postjobs (workflow, args, next_run_at{level}, queue) "
                    f"SELECT 'noop', jsonb_build_array(g), {due}{value}, {queue} "
                    "FROM generate_series(1, %s) g", (ready,))
    if shape == "future":
        level = ", priority" if priorities else ""
        value = ", 100" if priorities else ""
        cur.execute(f"INSERT INTO postjob.postjobs (workflow, next_run_at{level}) "
                    f"SELECT 'noop', now() + interval '1 day'{value} FROM generate_series(1, 10000)")
    cur.execute("VACUUM ANALYZE postjob.postjobs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", metavar="NAME=TREE")
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=1500, help="checkouts of 1 job per version")
    parser.add_argument("--same-jobs", action="store_true",
                        help="trees without priorities take part in every shape, on the same "
                        "jobs without their priorities (what a checkout costs with priorities "
                        "in use against the code before them, table for table)")
    parser.add_argument("--vacuum-every", type=int, default=0, metavar="N",
                        help="VACUUM each table every N rounds, outside the timing (0: never, "
                        "so the jobs taken leave their index entries behind, as in a drain "
                        "between two visits of autovacuum)")
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"which table shapes, comma-separated (of {', '.join(SHAPES)})")
    opts = parser.parse_args()
    unknown = set(opts.shapes.split(",")) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(sorted(unknown))} (of {', '.join(SHAPES)})")

    import psycopg2

    curs: dict[str, Any] = {}
    cycles: dict[str, str] = {}
    priorities: dict[str, bool] = {}
    for spec in opts.trees:
        name, _, tree = spec.partition("=")
        url = pg.fresh_database(opts.dsn_base, f"pjbench_ab_{name}")
        _install(Path(tree).resolve(), url)
        conn = psycopg2.connect(url)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("INSERT INTO postjob.postjobs (workflow, status, next_run_at, results) "
                    "SELECT 'noop', 'ok', NULL, '[null]' FROM generate_series(1, %s)",
                    (opts.finished,))
        cur.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = "
                    "'postjob' AND table_name = 'postjobs' AND column_name = 'priority'")
        priorities[name] = bool(cur.fetchone()[0])
        curs[name] = cur
        cycles[name] = _cycle(cur)

    names = list(curs)
    for shape in opts.shapes.split(","):
        label = SHAPES[shape]
        taking = [n for n in names
                  if shape in ("zero", "pairs") or priorities[n] or opts.same_jobs]
        served = WORKFLOWS.get(shape, "ARRAY['noop']::text[], ARRAY['']::text[]")
        cycle = {n: cycles[n].replace("{workflows}", served) for n in taking}
        for limit, calls in ((1, opts.calls), (100, max(opts.calls // 10, 20))):
            for n in taking:
                _fill(curs[n], calls * limit + 1000, shape, priorities[n])
            times: dict[str, list[float]] = {n: [] for n in taking}
            for call in range(calls):
                if opts.vacuum_every and call and call % opts.vacuum_every == 0:
                    for n in taking:
                        curs[n].execute("VACUUM postjob.postjobs")
                for n in taking:
                    t0 = time.perf_counter()
                    curs[n].execute(cycle[n], {"limit": limit})
                    got = len(curs[n].fetchall())
                    times[n].append(time.perf_counter() - t0)
                    assert got == limit, (n, shape, got)
            base = statistics.median(times[taking[0]])
            row = "  ".join(f"{n} {statistics.median(times[n]) * 1e6:7.0f} us "
                            f"({statistics.median(times[n]) / base:4.2f})" for n in taking)
            print(f"checkout {limit:3} job(s), {label:<28} {row}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
