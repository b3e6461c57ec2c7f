"""The moving parts of bench/soak.py: the fleet of processes, what is sampled each interval,
and the check that every job ran exactly once."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extras

from bench import soak_app
from bench.harness.scratch import ScratchCluster
from postjob_sa import _hot_tables

SPAWN = multiprocessing.get_context("spawn")

#: Every relation of the schema with its size, and the statistics of the tables.
RELATIONS = (
    "SELECT c.relname, c.relkind, COALESCE(t.relname, c.relname) AS table_name, "
    "pg_relation_size(c.oid) AS bytes, s.n_live_tup, s.n_dead_tup, s.vacuum_count, "
    "s.autovacuum_count, COALESCE(io.heap_blks_hit + io.heap_blks_read, "
    "ii.idx_blks_hit + ii.idx_blks_read) AS blocks FROM pg_class c "
    "LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid "
    "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
    "LEFT JOIN pg_statio_user_tables io ON io.relid = c.oid "
    "LEFT JOIN pg_statio_user_indexes ii ON ii.indexrelid = c.oid "
    "WHERE c.relnamespace = 'postjob'::regnamespace AND c.relkind IN ('r', 'i') ORDER BY 1"
)


def connect(url: str) -> Any:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def rows(url: str, sql: str, params: Any = None) -> list[dict[str, Any]]:
    conn = connect(url)
    try:
        with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            cur.execute(sql, params)
            return [dict(r) for r in cur.fetchall()] if cur.description else []
    finally:
        conn.close()


class Fleet:
    """Worker processes, a producer and a prober, with the files of their runs."""

    def __init__(self, url: str, driver: str, batch: int, settings: list[str]):
        self.url, self.driver, self.batch, self.settings = url, driver, batch, settings
        self.dir = tempfile.mkdtemp(prefix="postjob-soak-runs-")
        self.workers: list[multiprocessing.process.BaseProcess] = []
        self.feeders: list[multiprocessing.process.BaseProcess] = []
        self.stop_feeding = SPAWN.Event()
        self.sent: Synchronized[int] = SPAWN.Value("q", 0)  # type: ignore[assignment]
        self._probe_seen: dict[int, float] = {}
        self._probe_sent: dict[int, float] = {}
        self._probe_done: set[int] = set()

    def start_workers(self, n: int, workflows: list[str] | None = None) -> None:
        for _ in range(n):
            p = SPAWN.Process(target=soak_app.worker,
                              args=(self.url, self.driver, self.dir, self.batch, self.settings,
                                    workflows))
            p.start()
            self.workers.append(p)

    def start_producer(self, rate: float, first_key: int = 0) -> None:
        p = SPAWN.Process(target=soak_app.producer, args=(
            self.url, self.driver, rate, self.stop_feeding, self.sent, first_key))
        p.start()
        self.feeders.append(p)

    def start_prober(self) -> None:
        p = SPAWN.Process(target=soak_app.prober,
                          args=(self.url, self.driver, self.dir, self.stop_feeding))
        p.start()
        self.feeders.append(p)

    def stop_feeders(self) -> None:
        self.stop_feeding.set()
        for p in self.feeders:
            p.join(timeout=30)
        self.feeders = []
        self.stop_feeding = SPAWN.Event()

    def check_alive(self) -> None:
        for p in self.workers + self.feeders:
            if not p.is_alive():
                raise RuntimeError(f"process {p.pid} exited early ({p.exitcode}): see {self.dir}")

    def stop_workers(self) -> None:
        for p in self.workers:
            p.terminate()  # SIGTERM: the worker finishes its batch and exits
        for p in self.workers:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        self.workers = []

    def runs(self) -> int:
        """Runs of soak.job so far (the run files are fixed-width)."""
        return sum(f.stat().st_size for f in Path(self.dir).glob("*.runs")) // soak_app.RUN_LINE

    def wait_runs(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.runs() < n:
            if time.monotonic() > deadline:
                return False
            self.check_alive()
            time.sleep(0.2)
        return True

    def probe_latencies(self) -> tuple[list[float], int]:
        """Latencies (s) of the probes started since the last call, and the probes sent that
        have not started yet."""
        for pattern, into in (("*.probes", self._probe_seen), ("probes.sent", self._probe_sent)):
            for path in Path(self.dir).glob(pattern):
                for line in path.read_text().splitlines():
                    key, at = line.split()
                    if int(key) not in self._probe_done:
                        into.setdefault(int(key), float(at))
        done = [k for k in self._probe_sent if k in self._probe_seen]
        self._probe_done.update(done)
        out = [self._probe_seen.pop(k) - self._probe_sent.pop(k) for k in done]
        return out, len(self._probe_sent)

    def upkeep_lines(self) -> list[str]:
        out = []
        for path in Path(self.dir).glob("*.log"):
            out += [line for line in path.read_text().splitlines() if "upkeep" in line]
        return sorted(out)


@dataclass
class Relations:
    """The sizes and statistics of the schema's relations at one moment."""

    by_name: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def read(cls, url: str) -> Relations:
        return cls({r["relname"]: r for r in rows(url, RELATIONS)})

    def hot(self) -> list[str]:
        """The hot tables (postjob_sa._hot_tables) and their indexes, each table first."""
        out = []
        for table in (t.split(".", 1)[1] for t in _hot_tables.HOT_TABLES):
            if table in self.by_name:
                out.append(table)
                out += sorted(n for n, r in self.by_name.items()
                              if r["relkind"] == "i" and r["table_name"] == table)
        return out


def check_exactly_once(url: str, fleet: Fleet, sent: int, probes_sent: int) -> list[str]:
    """What is wrong, if anything: every key 0..sent-1 of soak.job must have been run exactly
    once by a run body, under the job id the database gave it, and every such job must be ok
    in the database; the same for the probes. Nothing sent is a failure too."""
    problems = []
    if sent <= 0:
        problems.append("no job was sent")
    runs: list[tuple[int, int]] = []
    for path in Path(fleet.dir).glob("*.runs"):
        for line in path.read_text().splitlines():
            job_id, key = line.split()
            runs.append((int(job_id), int(key)))
    by_key = Counter(k for _, k in runs)
    missing = sent - sum(1 for k in range(sent) if by_key.get(k))
    twice = sum(1 for c in by_key.values() if c > 1)
    stray = sum(1 for k in by_key if not 0 <= k < sent)
    if missing or twice or stray:
        problems.append(f"runs: {missing} keys never ran, {twice} ran more than once, "
                        f"{stray} were never sent")
    if len({j for j, _ in runs}) != len(runs):
        problems.append("a job id was run more than once")
    db = {r["id"]: r for r in rows(url, "SELECT id, (args->>0)::bigint AS key, status::text "
                                        "FROM postjob.postjobs WHERE workflow = %s",
                                   (soak_app.JOB,))}
    if len(db) != sent:
        problems.append(f"the database holds {len(db)} jobs, {sent} were sent")
    not_ok = sum(1 for r in db.values() if r["status"] != "ok")
    if not_ok:
        problems.append(f"{not_ok} jobs are not ok in the database")
    wrong = sum(1 for j, k in runs if j not in db or db[j]["key"] != k)
    if wrong:
        problems.append(f"{wrong} runs name a job id that does not hold their key")
    probe_runs = Counter(int(line.split()[0]) for path in Path(fleet.dir).glob("*.probes")
                         for line in path.read_text().splitlines())
    if sorted(probe_runs) != list(range(probes_sent)) or any(c != 1 for c in probe_runs.values()):
        problems.append(f"probes: {len(probe_runs)} distinct ran of {probes_sent} sent, "
                        f"{sum(1 for c in probe_runs.values() if c > 1)} more than once")
    return problems


def drop_files(fleet: Fleet) -> None:
    for path in Path(fleet.dir).iterdir():
        path.unlink()
    os.rmdir(fleet.dir)


WORKERS_UP = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
              "AND application_name LIKE 'postjob worker %'")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def new_database(pg: ScratchCluster, name: str, sql: list[str]) -> str:
    from sqlalchemy import create_engine

    import postjob_sa

    conn = connect(pg.url("postgres"))
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    url = pg.url(name)
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    postjob_sa.migrate(engine)
    engine.dispose()
    conn = connect(url)
    with conn.cursor() as cur:
        for statement in sql:
            cur.execute(statement)
    conn.close()
    return url


def start_fleet(url: str, args: argparse.Namespace, fleet: Fleet | None = None,
                workers: int | None = None, workflows: list[str] | None = None) -> Fleet:
    """Start worker processes (in ``fleet``, else a new one); wait until they are up."""
    if fleet is None:
        settings = list(args.tune)
        if args.upkeep == "off":
            settings.append("postjob_sa.worker.upkeep.ENABLED=off")
        fleet = Fleet(url, args.driver, args.batch, settings)
    n = args.workers if workers is None else workers
    fleet.start_workers(n, workflows)
    deadline = time.monotonic() + 60
    while rows(url, WORKERS_UP)[0]["count"] < n:
        fleet.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not connect within 60 s")
        time.sleep(0.1)
    time.sleep(1.0)  # registered and idle
    return fleet
