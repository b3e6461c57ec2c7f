"""Pressure: a queue at a fixed rate while other transactions hold snapshots (issue 39).

    .venv/bin/python bench/pressure.py [--rate 800] [--phase 60] [--workers 2] [--batch 100]
        [--probes 20] [--readers 4] [--reader-pause 1.0] [--interval 10] [--output FILE]

A snapshot that a transaction holds keeps every row version deleted or updated after it
began, anywhere in the database: no VACUUM can remove them until it ends. This bench measures
what that does to the queue. It initdbs a scratch cluster with PostgreSQL's default settings
(autovacuum on; bench/harness/scratch.py's ``ScratchCluster``, the one bench/soak.py uses),
migrates a database, starts ``--workers`` worker processes (``JobQueue(...).work()``, batches
of ``--batch``), a producer enqueuing ``--rate`` jobs a second through ``enqueue_many`` (in
transactions of what is due every 20 ms) and a prober enqueuing ``--probes`` probe jobs a
second, each timed from its enqueue's commit to the start of its body (the claim latency);
these are bench/soak_app.py's processes. Then three phases of ``--phase`` seconds each:

- ``clean``: nothing else runs;
- ``snapshot``: one idle connection holds a snapshot (``BEGIN ISOLATION LEVEL REPEATABLE
  READ; SELECT txid_current();``) for the whole phase;
- ``readers``: ``--readers`` connections, each in one REPEATABLE READ transaction for the
  whole phase, scan the queue's tables (``postjob.unfinished``, ``postjob.postjobs``,
  ``postjob.workers``) again every ``--reader-pause`` seconds.

Every ``--interval`` seconds it prints the jobs run per second, the claim latency p50/p99 of
the probes that started in the interval, the queue depth (jobs sent and not yet run), the
buffers read per job run in ``postjob.unfinished`` and in its due index (pg_statio: every
reader of those counts, so in the ``readers`` phase their scans count too), and the dead rows
of ``postjob.unfinished``. At the end it lets the workers finish what was sent (at most
``--drain-timeout`` seconds), prints per phase the same figures and every job's latency from
its enqueue to its settle (the record's created_at to updated_at: a bound of the claim
latency plus the run and its batch's wait for the next round trip), and checks that every job
ran exactly once (bench/harness/soakfleet.py's check, counted in the job record too). It exits
1 when that check finds a problem. A run takes 3 x ``--phase`` plus about a minute (the
cluster, the migration, the drain), never more than ``--drain-timeout`` beyond.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import soak_app
from bench.harness.scratch import ScratchCluster
from bench.harness.soakfleet import (
    SPAWN,
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

PHASES = ("clean", "snapshot", "readers")
SCANS = (
    "SELECT count(*), max(job_id) FROM postjob.unfinished",
    "SELECT status, count(*) FROM postjob.postjobs GROUP BY status",
    "SELECT count(*) FROM postjob.workers",
)
#: Every soak.job's time from its enqueue to its settle, by interval since t0 (DB clock).
SETTLE_LATENCY = (
    "SELECT floor(extract(epoch FROM updated_at - %(t0)s) / %(interval)s)::int AS n, "
    "count(*) AS jobs, percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP "
    "(ORDER BY extract(epoch FROM updated_at - created_at)) AS p "
    "FROM postjob.postjobs WHERE workflow = %(wf)s AND status = 'ok' GROUP BY 1 ORDER BY 1"
)


def _ms(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class Holders:
    """The connections of a phase that hold snapshots: an idle one, or readers in a loop."""

    def __init__(self, url: str):
        self.url = url
        self.conns: list[Any] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.scans = 0

    def _begin(self) -> Any:
        conn = connect(self.url)
        conn.autocommit = True  # the BEGIN is ours, as a psql user's would be
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT txid_current()")
        self.conns.append(conn)
        return conn

    def hold_idle(self) -> None:
        self._begin()

    def start_readers(self, n: int, pause: float) -> None:
        for _ in range(n):
            conn = self._begin()
            thread = threading.Thread(target=self._read, args=(conn, pause), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _read(self, conn: Any, pause: float) -> None:
        with conn.cursor() as cur:
            while not self.stop.is_set():
                for sql in SCANS:
                    cur.execute(sql)
                    cur.fetchall()
                self.scans += 1
                self.stop.wait(pause)

    def release(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
        for conn in self.conns:
            try:
                with conn.cursor() as cur:
                    cur.execute("ROLLBACK")
            finally:
                conn.close()
        self.conns, self.threads = [], []
        self.stop = threading.Event()


def _blocks(url: str) -> dict[str, int]:
    return {n: r["blocks"] or 0 for n, r in Relations.read(url).by_name.items()}


def run(pg: ScratchCluster, args: argparse.Namespace) -> dict[str, Any]:
    url = new_database(pg, "pressure", [])
    fleet = start_fleet(url, args)
    holders = Holders(url)
    try:
        return _run(url, fleet, holders, args)
    finally:  # whatever happened: no process or snapshot of ours is left
        holders.release()
        fleet.stop_feeders()
        fleet.stop_workers()


def _start_prober(fleet: Fleet, args: argparse.Namespace) -> None:
    p = SPAWN.Process(target=soak_app.prober, args=(
        fleet.url, fleet.driver, fleet.dir, fleet.stop_feeding, 1.0 / args.probes))
    p.start()
    fleet.feeders.append(p)


def _run(url: str, fleet: Fleet, holders: Holders, args: argparse.Namespace) -> dict[str, Any]:
    t0_db = rows(url, "SELECT clock_timestamp() AS t")[0]["t"]
    fleet.start_producer(args.rate)
    _start_prober(fleet, args)
    t0 = time.monotonic()
    log("phase        t  jobs/s  p50 ms   p99 ms  probes   depth  unfinished/job  due_idx/job"
        "  dead rows")
    intervals: list[dict[str, Any]] = []
    done_before, blocks_before = 0, _blocks(url)
    per_phase = int(round(args.phase / args.interval))
    for n in range(1, per_phase * len(PHASES) + 1):
        phase = PHASES[(n - 1) // per_phase]
        if (n - 1) % per_phase == 0:  # a phase begins
            holders.release()
            if phase == "snapshot":
                holders.hold_idle()
            elif phase == "readers":
                holders.start_readers(args.readers, args.reader_pause)
        time.sleep(max(0.0, t0 + n * args.interval - time.monotonic()))
        fleet.check_alive()
        done = fleet.runs()
        latencies, pending = fleet.probe_latencies()
        blocks = _blocks(url)
        jobs = max(1, done - done_before)
        unf = rows(url, "SELECT n_dead_tup FROM pg_stat_user_tables "
                        "WHERE relid = 'postjob.unfinished'::regclass")[0]["n_dead_tup"]
        record = {
            "phase": phase, "t": time.monotonic() - t0, "runs": done, "sent": fleet.sent.value,
            "jobs_per_s": (done - done_before) / args.interval,
            "p50_ms": _ms(latencies, 0.5), "p99_ms": _ms(latencies, 0.99),
            "probes": latencies, "probes_pending": pending,
            "depth": fleet.sent.value - done, "dead_rows": unf,
            "unfinished_blocks_per_job":
                (blocks.get("unfinished", 0) - blocks_before.get("unfinished", 0)) / jobs,
            "due_idx_blocks_per_job":
                (blocks.get("unfinished_due_idx", 0)
                 - blocks_before.get("unfinished_due_idx", 0)) / jobs,
        }
        done_before, blocks_before = done, blocks
        intervals.append(record)
        log(f"{phase:9s} {record['t']:4.0f} {record['jobs_per_s']:7.0f} {record['p50_ms']:7.1f}"
            f"  {record['p99_ms']:7.1f} {len(latencies):4d}+{pending:<3d} {record['depth']:7d}"
            f"  {record['unfinished_blocks_per_job']:14.1f} "
            f"{record['due_idx_blocks_per_job']:12.1f}  {unf:9d}")
    holders.release()
    fleet.stop_feeders()
    sent = fleet.sent.value
    probes_sent = len((Path(fleet.dir) / "probes.sent").read_text().splitlines())
    log(f"drain: {sent - fleet.runs()} jobs left to run (at most {args.drain_timeout:.0f} s)")
    t_drain = time.monotonic()
    drained = fleet.wait_runs(sent, timeout=args.drain_timeout)
    drain_s = time.monotonic() - t_drain
    fleet.stop_workers()
    problems = [] if drained else [
        f"the workers did not finish what was sent within {args.drain_timeout:.0f} s"]
    problems += check_exactly_once(url, fleet, sent, probes_sent)
    settle = rows(url, SETTLE_LATENCY, {"t0": t0_db, "interval": args.interval,
                                         "wf": soak_app.JOB})
    drop_files(fleet)
    summary = summarize(intervals, settle, per_phase, args)
    return {"sent": sent, "probes_sent": probes_sent, "drain_s": drain_s,
            "intervals": intervals, "settle_latency": settle, "summary": summary,
            "problems": problems}


def summarize(intervals: list[dict[str, Any]], settle: list[dict[str, Any]], per_phase: int,
              args: argparse.Namespace) -> dict[str, Any]:
    """Per phase: mean jobs/s, the probes' p50/p99, the depth at its end, buffers per job
    (median of its intervals), and the enqueue-to-settle latency of the jobs settled in it
    (the median of its intervals' p50s, the worst of their p99s)."""
    out: dict[str, Any] = {}
    for k, phase in enumerate(PHASES):
        part = [r for r in intervals if r["phase"] == phase]
        if not part:
            continue
        probes = [v for r in part for v in r["probes"]]
        own = [s for s in settle if k * per_phase <= s["n"] < (k + 1) * per_phase]

        def median(key: str, rs: list[dict[str, Any]] = part) -> float:
            values = sorted(float(r[key]) for r in rs)
            return values[len(values) // 2]

        out[phase] = {
            "jobs_per_s": sum(r["jobs_per_s"] for r in part) / len(part),
            "probe_p50_ms": _ms(probes, 0.5), "probe_p99_ms": _ms(probes, 0.99),
            "probes": len(probes), "depth_end": part[-1]["depth"],
            "depth_max": max(r["depth"] for r in part),
            "unfinished_blocks_per_job": median("unfinished_blocks_per_job"),
            "due_idx_blocks_per_job": median("due_idx_blocks_per_job"),
            "due_idx_blocks_per_job_last": part[-1]["due_idx_blocks_per_job"],
            "dead_rows_end": part[-1]["dead_rows"],
            "settle_p50_ms": 1000 * sorted(s["p"][0] for s in own)[len(own) // 2] if own
            else None,
            "settle_p99_ms_worst": 1000 * max(s["p"][1] for s in own) if own else None,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=800.0, help="jobs/s the producer sends")
    parser.add_argument("--phase", type=float, default=60.0, help="seconds of each phase")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100, help="the workers' batch_size")
    parser.add_argument("--probes", type=float, default=20.0, help="probe jobs a second")
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--reader-pause", type=float, default=1.0,
                        help="seconds between one reader's scans")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--driver", choices=("psycopg", "psycopg2"), default="psycopg")
    parser.add_argument("--output", help="write the figures as JSON here")
    args = parser.parse_args()
    if args.phase < args.interval or args.rate <= 0 or args.probes <= 0 or args.workers < 1:
        parser.error("--phase must be at least --interval; --rate, --probes, --workers > 0")
    args.tune, args.upkeep = [], "on"  # what start_fleet reads: the workers as released
    started = datetime.now(UTC)
    log(f"pressure: {started:%Y-%m-%d %H:%M} UTC, {platform.node()}; a scratch cluster "
        "(bench/harness/scratch.py ScratchCluster, as bench/soak.py), PostgreSQL defaults, "
        f"autovacuum on; rate {args.rate:.0f} jobs/s, {args.workers} workers x batch "
        f"{args.batch}, phases {'/'.join(PHASES)} of {args.phase:.0f} s")
    with ScratchCluster({}) as pg:
        version = rows(pg.url("postgres"), "SHOW server_version")[0]["server_version"]
        log(f"server: PostgreSQL {version}")
        out = run(pg, args)
    out["args"] = vars(args)
    out["started"] = started.isoformat()
    out["server_version"] = version
    print(json.dumps(out["summary"], indent=2, default=str))
    print(f"sent {out['sent']} jobs and {out['probes_sent']} probes; drained in "
          f"{out['drain_s']:.0f} s")
    for problem in out["problems"]:
        print(f"PROBLEM: {problem}")
    if not out["problems"]:
        print(f"every job ran exactly once ({out['sent']} jobs, {out['probes_sent']} probes, "
              "each run once and ok in the record)")
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1, default=str))
    return 1 if out["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
