"""Soak: a queue under a steady load for a set time, on a PostgreSQL cluster of its own.

    .venv/bin/python bench/soak.py [--minutes 3] [--rate 60%] [--workers 2] [--batch 100]
        [--autovacuum on|off] [--upkeep on|off] [--sql STATEMENT]... [--output FILE]
    .venv/bin/python bench/soak.py --backlog 1000000 [--chunk 200000] [--watch 3]

It initdbs a scratch cluster (PostgreSQL's default settings; ``--autovacuum off`` turns the
daemon off), migrates a database, runs ``--sql`` statements (per-table settings to try), and
then runs ``--workers`` worker processes (``JobQueue(...).work()``, batches of ``--batch``), a
producer enqueuing ``--rate`` jobs a second (a number, or a percentage of the sustainable
rate, measured first by a drain of ``--calibrate`` jobs on a database of its own), and a
probe job every second, timed from its enqueue's commit to the start of its body. Every
``--interval`` seconds it prints the throughput, the probe's latency, and the hot tables'
and their indexes' sizes (``pg_relation_size``) and dead rows. At the end it lets the
workers finish what was sent and checks that every job ran exactly once (bench/harness/
soakfleet.py says how). ``--backlog N`` runs the backlog experiment instead (bench/
soak_backlog.py). ``--tune MODULE.NAME=VALUE`` sets a constant in the workers (e.g.
``postjob_sa._hot_tables.DEAD_ROWS=20000``); ``--upkeep off`` runs them without the upkeep.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import soak_app
from bench.harness.scratch import ScratchCluster
from bench.harness.soakfleet import (
    Fleet,
    Relations,
    check_exactly_once,
    connect,
    drop_files,
    log,
    new_database,
    rows,
    start_fleet,
)
from postjob_sa import _hot_tables

#: With --statements (pg_stat_statements loaded and created): where the blocks went.
TOP_STATEMENTS = (
    "SELECT calls, (shared_blks_hit + shared_blks_read)::float8 / calls AS blocks_per_call, "
    "left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query FROM pg_stat_statements "
    "WHERE calls > 0 ORDER BY shared_blks_hit + shared_blks_read DESC LIMIT 12"
)


def sustainable_rate(pg: ScratchCluster, args: argparse.Namespace) -> float:
    """Jobs per second the workers drain flat out: ``--calibrate`` jobs committed at once while
    they wait, timed from the commit to the last run (a database of its own, dropped after)."""
    url = new_database(pg, "calibrate", args.sql)
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    import postjob_sa

    fleet = start_fleet(url, args)
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with Session(engine) as session:
        queue = postjob_sa.JobQueue(session)
        for start in range(0, args.calibrate, 10_000):
            n = min(10_000, args.calibrate - start)
            queue.enqueue_many(soak_app.JOB, [[k] for k in range(start, start + n)])
        session.commit()
        t0 = time.monotonic()
    engine.dispose()
    fleet.wait_runs(args.calibrate, timeout=600)
    rate = args.calibrate / (time.monotonic() - t0)
    fleet.stop_workers()
    drop_files(fleet)
    conn = connect(pg.url("postgres"))
    with conn.cursor() as cur:
        cur.execute('DROP DATABASE "calibrate" WITH (FORCE)')
    conn.close()
    return rate


def _ms(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _line(t: float, r: dict[str, Any], hot: list[str]) -> str:
    cells = [f"{t:6.0f}", f"{r['jobs_per_s']:7.0f}", f"{r['probe_p50_ms']:8.1f}",
             f"{r['probe_max_ms']:8.1f}", f"{r['probes_pending']:3d}"]
    for name in hot:
        rel = r["relations"][name]
        cell = f"{rel['bytes'] // 1024:7d}"
        if rel["relkind"] == "r":
            cell += f" {rel['n_dead_tup'] or 0:7d} {rel['autovacuum_count'] or 0:3d}" \
                    f"/{rel['vacuum_count'] or 0:<3d}"
        cells.append(cell)
    record = r["relations"].get(_hot_tables.RECORD_TABLE.split(".", 1)[1])
    if record is not None:  # the job record grows with the jobs kept: by design
        cells.append(f"{record['bytes'] / 2**20:8.1f}")
    top = sorted(r["blocks_per_job"].items(), key=lambda kv: -kv[1])[:3]
    cells.append("  " + " ".join(f"{n}:{v:.1f}" for n, v in top))
    return " ".join(cells)


def soak(pg: ScratchCluster, args: argparse.Namespace, rate: float) -> dict[str, Any]:
    url = new_database(pg, "soak", args.sql)
    fleet = start_fleet(url, args)
    hot = Relations.read(url).hot()
    log("     t  jobs/s  p50 ms   max ms  pend  " + "  ".join(
        f"{n} kB" + (" dead av/vac" if Relations.read(url).by_name[n]["relkind"] == "r" else "")
        for n in hot) + "  record MB  most read per job")
    try:
        return _soak(url, fleet, hot, args, rate)
    finally:  # whatever happened: no process of ours is left running
        fleet.stop_feeders()
        fleet.stop_workers()


def _soak(url: str, fleet: Fleet, hot: list[str], args: argparse.Namespace,
          rate: float) -> dict[str, Any]:
    fleet.start_producer(rate)
    fleet.start_prober()
    t0 = time.monotonic()
    intervals: list[dict[str, Any]] = []
    done_before = 0
    blocks_before = {n: r["blocks"] or 0 for n, r in Relations.read(url).by_name.items()}
    for n in range(1, int(args.minutes * 60 / args.interval) + 1):
        time.sleep(max(0.0, t0 + n * args.interval - time.monotonic()))
        fleet.check_alive()
        t = time.monotonic() - t0
        done = fleet.runs()
        latencies, pending = fleet.probe_latencies()
        relations = Relations.read(url).by_name
        blocks = {n: r["blocks"] or 0 for n, r in relations.items()}
        per_job = {n: (b - blocks_before.get(n, 0)) / max(1, done - done_before)
                   for n, b in blocks.items() if b > blocks_before.get(n, 0)}
        blocks_before = blocks
        record = {"t": t, "runs": done, "sent": fleet.sent.value, "blocks_per_job": per_job,
                  "jobs_per_s": (done - done_before) / args.interval,
                  "probe_p50_ms": _ms(latencies, 0.5), "probe_max_ms": _ms(latencies, 1.0),
                  "probes": latencies, "probes_pending": pending, "relations": relations}
        done_before = done
        intervals.append(record)
        log(_line(t, record, hot))
    fleet.stop_feeders()
    sent = fleet.sent.value
    probes_sent = len((Path(fleet.dir) / "probes.sent").read_text().splitlines())
    drained = fleet.wait_runs(sent, timeout=300)
    fleet.stop_workers()
    problems = [] if drained else ["the workers did not finish what was sent within 300 s"]
    problems += check_exactly_once(url, fleet, sent, probes_sent)
    upkeep = fleet.upkeep_lines()
    if args.statements:
        statements = rows(url, TOP_STATEMENTS)
        for r in statements:
            log(f"{r['blocks_per_call']:10.1f} blocks/call {r['calls']:8d} calls  {r['query']}")
    drop_files(fleet)
    return {"rate": rate, "sent": sent, "intervals": intervals, "problems": problems,
            "upkeep_log": upkeep, "hot": hot, "summary": summarize(intervals, hot, rate)}


def summarize(intervals: list[dict[str, Any]], hot: list[str], rate: float) -> dict[str, Any]:
    """The issue's targets: the last minute against the first."""
    first = [r for r in intervals if r["t"] <= 60.5]
    last = [r for r in intervals if r["t"] > intervals[-1]["t"] - 60]

    def rate_of(part: list[dict[str, Any]]) -> float:
        return statistics.mean(r["jobs_per_s"] for r in part)

    def p50(part: list[dict[str, Any]]) -> float:
        values = [v for r in part for v in r["probes"]]
        return _ms(values, 0.5)

    after_first = first[-1]["relations"]
    end = intervals[-1]["relations"]
    return {
        "target_rate": rate, "first_minute_jobs_per_s": rate_of(first),
        "last_minute_jobs_per_s": rate_of(last),
        "throughput_last_vs_first": rate_of(last) / max(rate_of(first), 1e-9),
        "probe_p50_first_ms": p50(first), "probe_p50_last_ms": p50(last),
        "probe_p50_last_vs_first": p50(last) / max(p50(first), 1e-9),
        "sizes_end_vs_first_minute": {
            n: end[n]["bytes"] / max(after_first[n]["bytes"], 8192) for n in hot},
        "sizes_end_bytes": {n: end[n]["bytes"] for n in hot},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rate", default="60%",
                        help="jobs/s, or a percentage of the measured sustainable rate")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--autovacuum", choices=("on", "off"), default="on")
    parser.add_argument("--upkeep", choices=("on", "off"), default="on")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a server setting of the scratch cluster (repeatable)")
    parser.add_argument("--sql", action="append", default=[],
                        help="a statement run after the migration (repeatable)")
    parser.add_argument("--tune", action="append", default=[], metavar="MODULE.NAME=VALUE")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--calibrate", type=int, default=30_000)
    parser.add_argument("--driver", choices=("psycopg", "psycopg2"), default="psycopg")
    parser.add_argument("--backlog", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=200_000)
    parser.add_argument("--standing", type=int, default=2_000)
    parser.add_argument("--watch", type=float, default=3.0, help="backlog: minutes after it")
    parser.add_argument("--statements", action="store_true",
                        help="print the statements that read the most blocks (needs "
                        "--setting shared_preload_libraries=pg_stat_statements and --sql "
                        "'CREATE EXTENSION pg_stat_statements')")
    parser.add_argument("--server-log", help="keep the cluster's log here")
    parser.add_argument("--output", help="write the figures as JSON here")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.setting)
    with ScratchCluster({"autovacuum": args.autovacuum, **settings}) as pg:
        if args.backlog:
            from bench.soak_backlog import backlog

            out = backlog(pg, args)
        else:
            if args.rate.endswith("%"):
                sustainable = sustainable_rate(pg, args)
                rate = sustainable * float(args.rate[:-1]) / 100
                log(f"sustainable: {sustainable:.0f} jobs/s; soaking at {rate:.0f} jobs/s")
            else:
                rate = float(args.rate)
            out = soak(pg, args, rate)
            out["sustainable"] = sustainable if args.rate.endswith("%") else None
        if args.server_log:
            pg.keep_log(args.server_log)
    out["args"] = vars(args)
    print(json.dumps(out.get("summary", {}), indent=2, default=str))
    for problem in out.get("problems", []):
        print(f"PROBLEM: {problem}")
    if not out.get("problems"):
        print("every job ran exactly once" if not args.backlog else "done")
    for line in out.get("upkeep_log", [])[-20:]:
        print(line)
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1, default=str))
    return 1 if out.get("problems") else 0


if __name__ == "__main__":
    sys.exit(main())
