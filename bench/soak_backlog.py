"""The backlog experiment of bench/soak.py (``--backlog N``): does a checkout return to its
empty-table cost after a large backlog has drained, with nobody acting?

* the baseline: ``--standing`` jobs (2,000) are due on fresh tables, and a checkout of 1 and
  of 100 is timed (median of ``SAMPLES``, each in a transaction rolled back, so every one
  finds the same jobs), with the buffers it reads (in the hot tables, and in all);
* ``--workers`` workers (with their upkeep unless ``--upkeep off``) drain them and then N
  jobs, enqueued in chunks of ``--chunk``, all in the same key range of the due index;
* they stop; ``--standing`` jobs are due again in that range, and one worker that does not
  run them (it serves another workflow) stays up, with its upkeep; for ``--watch`` minutes
  the same checkouts are timed every ``--interval`` seconds against the baseline, beside the
  hot tables' sizes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg2

from bench import soak_app
from bench.harness.scratch import ScratchCluster
from bench.harness.soakfleet import (
    Relations,
    connect,
    drop_files,
    log,
    new_database,
    rows,
    start_fleet,
)
from postjob_sa import _hot_tables as hot_tables

SAMPLES = 25
CHECKOUT = (
    "SELECT id FROM postjob.checkout_v4(NULL, 'soak probe', ARRAY[%s], ARRAY[''], "
    "ARRAY['q'], %s, 60, false, false, false)"
)
#: Buffers this transaction read so far, per relation of the schema.
BLOCKS = (
    "SELECT c.relname, pg_stat_get_xact_blocks_fetched(c.oid) AS blocks FROM pg_class c "
    "WHERE c.relnamespace = 'postjob'::regnamespace AND c.relkind IN ('r', 'i')"
)


def _enqueue(url: str, first: int, n: int, queue: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    import postjob_sa

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with Session(engine) as session:
        jobs = postjob_sa.JobQueue(session)
        for start in range(first, first + n, 10_000):
            keys = range(start, min(start + 10_000, first + n))
            jobs.enqueue_many(soak_app.JOB, [[k] for k in keys], queue=queue)
            session.commit()
    engine.dispose()


def checkout_costs(url: str, hot: set[str]) -> dict[str, float]:
    """Median time (ms) and buffers (hot tables, all) of a checkout of 1 and of 100."""
    out: dict[str, float] = {}
    conn = psycopg2.connect(url)  # not autocommit: each checkout is rolled back
    try:
        with conn.cursor() as cur:
            for limit in (1, 100):
                times, hot_blocks, all_blocks = [], [], []
                for _ in range(SAMPLES):
                    cur.execute(BLOCKS)
                    before = dict(cur.fetchall())
                    t0 = time.perf_counter()
                    cur.execute(CHECKOUT, (soak_app.JOB, limit))
                    got = len(cur.fetchall())
                    times.append(time.perf_counter() - t0)
                    cur.execute(BLOCKS)
                    read = {k: v - before.get(k, 0) for k, v in cur.fetchall()}
                    conn.rollback()
                    hot_blocks.append(sum(v for k, v in read.items() if k in hot))
                    all_blocks.append(sum(read.values()))
                assert got == limit, f"the checkout of {limit} took {got}"
                out[f"ms_{limit}"] = statistics.median(times) * 1000
                out[f"hot_blocks_{limit}"] = statistics.median(hot_blocks)
                out[f"blocks_{limit}"] = statistics.median(all_blocks)
    finally:
        conn.close()
    return out


def _ratios(now: dict[str, float], base: dict[str, float]) -> str:
    return "  ".join(f"{k} {now[k]:.2f} ({now[k] / base[k]:.2f}x)" for k in now)


def _sizes(url: str, hot: set[str]) -> dict[str, int]:
    return {n: r["bytes"] for n, r in Relations.read(url).by_name.items() if n in hot}


def backlog(pg: ScratchCluster, args: argparse.Namespace) -> dict[str, Any]:
    url = new_database(pg, "backlog", args.sql)
    standing_key = 10**9
    _enqueue(url, standing_key, args.standing, "q")
    conn = connect(url)
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
    conn.close()
    hot = set(Relations.read(url).hot())
    base = checkout_costs(url, hot)
    log(f"empty tables: {_ratios(base, base)}")
    fleet = start_fleet(url, args)  # they drain the standing jobs too, then the backlog
    sent, ran = 0, args.standing
    chunks = []
    while sent < args.backlog:
        n = min(args.chunk, args.backlog - sent)
        _enqueue(url, sent, n, "q")
        t0 = time.monotonic()
        sent, ran = sent + n, ran + n
        if not fleet.wait_runs(ran, timeout=1800):
            raise RuntimeError("a chunk did not drain within 30 minutes")
        seconds = time.monotonic() - t0
        chunks.append({"jobs": n, "seconds": seconds, "sizes": _sizes(url, hot)})
        log(f"drained {sent:,}: {n / seconds:,.0f} jobs/s; "
            + " ".join(f"{k} {v // 1024} kB" for k, v in chunks[-1]["sizes"].items()))
    # the drain is over: the same key range gets its standing jobs again, and one worker that
    # runs none of them (it serves another workflow) stays up, with its upkeep
    fleet.stop_workers()
    _enqueue(url, standing_key + args.standing, args.standing, "q")
    start_fleet(url, args, fleet, workers=1, workflows=[soak_app.OTHER])
    watch = []
    t0 = time.monotonic()
    for i in range(1, int(args.watch * 60 / args.interval) + 1):
        time.sleep(max(0.0, t0 + i * args.interval - time.monotonic()))
        costs = checkout_costs(url, hot)
        watch.append({"t": time.monotonic() - t0, "costs": costs, "sizes": _sizes(url, hot)})
        log(f"{watch[-1]['t']:5.0f} s after: {_ratios(costs, base)}  "
            + " ".join(f"{k} {v // 1024} kB" for k, v in watch[-1]["sizes"].items()))
    upkeep = fleet.upkeep_lines()
    fleet.stop_workers()
    drop_files(fleet)
    state = [hot_tables.Relation.of(r) for r in rows(url, hot_tables.HOT_RELATIONS_STATE,
                                                      hot_tables.PARAMS)]
    for rel in state:
        log(f"{rel.name}: {rel.bytes // 1024} kB, {rel.live_rows:,} live and {rel.dead_rows:,} "
            + (f"; swollen past {rel.swollen_past(rel.live_rows) // 1024} kB for them"
               if rel.is_index else f"; holds at most {rel.capacity:,} rows"))
    last = watch[-1]["costs"] if watch else base
    summary = {f"{k}_vs_empty": last[k] / base[k] for k in base}
    return {"baseline": base, "chunks": chunks, "watch": watch, "summary": summary,
            "upkeep_log": upkeep, "problems": []}
