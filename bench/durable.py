"""The cost of durable workflows: a step, and jobs that sleep or wait beside a checkout.

    .venv/bin/python bench/durable.py [--dsn-base postgresql://root@127.0.0.1:5432]
        [--steps 2000] [--repeat 5] [--sleeping 100000] [--waiting 100000] [--calls 300]
        [--only steps|sleepers] [--database pjbench_durable] [--async-commit]

1. A step. One run of a workflow that calls ``--steps`` steps of a trivial function, against
   the same run calling the function as often without steps: microseconds per recorded step,
   and the statements the run's connection sent. Then the job is reset and runs again with
   every step stored: microseconds per stored step, and its statements (one load per run).
2. Sleepers beside a checkout. A checkout of 1 (and of 100) due jobs through
   ``checkout_v4`` (as the worker's cycle calls it, making due what has come due), and an
   idle worker's wait (``worker_idle_v2``), in a transaction rolled back each time: buffers read
   in the postjob schema (as tests/api/test_checkout_cost.py counts them) and the median time,
   with nothing beside the 5,000 due jobs, then with ``--sleeping`` jobs in a durable sleep
   until tomorrow and ``--waiting`` jobs waiting for an event, all made by running their
   workflows for real, of workflows the same worker serves.

A scratch database (``--database``, default ``pjbench_durable``) is made anew, and left.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from bench.harness import pg
from postjob_sa import JobQueue, Registry
from postjob_sa._db import Conn

reg = Registry()
#: the sleepers' workflows, in a registry of their own: the workers that make them sleep leave
#: the due jobs of the measurement alone
sleepers = Registry()


def _noop(i: int) -> int:
    return i


@postjob_sa.workflow(name="bench.steps", registry=reg)
def with_steps(n: int) -> float:
    """The seconds its n steps took in this run."""
    started = time.perf_counter()
    for i in range(n):
        postjob_sa.step(f"s{i}", _noop, i)
    return time.perf_counter() - started


@postjob_sa.workflow(name="bench.plain", registry=reg)
def without_steps(n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        _noop(i)
    return time.perf_counter() - started


@postjob_sa.workflow(name="bench.nap", registry=sleepers)
def nap() -> None:
    postjob_sa.sleep(86_400)


@postjob_sa.workflow(name="bench.wait", registry=sleepers)
def wait(key: str) -> None:
    postjob_sa.wait_for_event(key)


@postjob_sa.workflow(name="bench.due", registry=reg)
def due() -> None:
    return None


#: The lease of the step runs' workers (short: see _run_twice).
LEASE = 2.0

SERVED = ["bench.due", "bench.nap", "bench.wait", "bench.steps", "bench.plain"]

#: Statements sent through the worker's connections, by their first words.
SENT: Counter[str] = Counter()


def _count_statements() -> None:
    """Count what the worker's connections send (wrapping Conn's three entry points)."""
    for name in ("rows", "tuples", "scalar"):
        original = getattr(Conn, name)

        def counted(self: Conn, sql: str, params: Any = None, _original: Any = original) -> Any:
            SENT[" ".join(sql.split()[:3])[:60]] += 1
            return _original(self, sql, params)

        setattr(Conn, name, counted)


def _result(session: Session, job_id: int) -> float:
    session.commit()
    return float(session.execute(text("SELECT results->>0 FROM postjob.postjobs WHERE id = :j"),
                                 {"j": job_id}).scalar_one())


def _run_twice(engine: Engine, workflow: Any, n: int) -> tuple[float, float, Counter[str],
                                                                 Counter[str]]:
    """The seconds the run's loop took, first with nothing stored, then (the job reset) with
    everything stored; and the statements each sent."""
    with Session(engine) as s:
        q = JobQueue(s, registry=reg, lease=LEASE)
        job_id = q.enqueue(workflow, n).id
        s.commit()
        SENT.clear()
        q.drain()
        first, sent_first = _result(s, job_id), Counter(SENT)
        # (a reset skips a job whose lease row has not ended yet: the drain's last one may
        # linger until its lease expires)
        deadline = time.monotonic() + 2 * LEASE + 5
        while not q.reset(job_id) and time.monotonic() < deadline:
            s.rollback()
            time.sleep(0.2)
        s.commit()
        SENT.clear()
        q.drain()
        again, sent_again = _result(s, job_id), Counter(SENT)
    return first, again, sent_first, sent_again


def _statements(sent: Counter[str], start: str) -> int:
    return sum(v for k, v in sent.items() if k.startswith(start))


def bench_steps(engine: Engine, steps: int, repeat: int) -> None:
    rows = [(_run_twice(engine, with_steps, steps), _run_twice(engine, without_steps, steps))
            for _ in range(repeat)]
    first = statistics.median(r[0][0] for r in rows)
    again = statistics.median(r[0][1] for r in rows)
    plain = statistics.median(r[1][0] for r in rows)
    (_, _, sent_first, sent_again), _ = rows[-1]
    print(f"steps: {steps} steps of a trivial function in one run, median of {repeat} runs")
    print(f"  recorded: {(first - plain) / steps * 1e6:8.1f} µs per step; statements: "
          f"{_statements(sent_first, 'SELECT result, error')} records, "
          f"{_statements(sent_first, 'SELECT kind, name,')} load")
    print(f"  stored:   {(again - plain) / steps * 1e6:8.1f} µs per step; statements: "
          f"{_statements(sent_again, 'SELECT result, error')} records, "
          f"{_statements(sent_again, 'SELECT kind, name,')} load")


BLOCKS = text(
    "SELECT COALESCE(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint "
    "FROM pg_class c WHERE c.relnamespace = 'postjob'::regnamespace AND c.relkind IN ('r', 'i')"
)
CHECKOUT = text(
    "SELECT id FROM postjob.checkout_v4(NULL, 'bench', CAST(:w AS text[]), CAST(:v AS text[]), "
    "NULL, :limit, 60, false, false, true)"
)
IDLE = text(
    "SELECT postjob.worker_idle_v2(NULL, CAST(:w AS text[]), CAST(:v AS text[]), NULL, false)"
)


def _measure(engine: Engine, calls: int) -> dict[str, tuple[int, float]]:
    params = {"w": SERVED, "v": [""] * len(SERVED)}
    found: dict[str, tuple[int, float]] = {}
    for label, stmt, extra in (("checkout 1", CHECKOUT, {"limit": 1}),
                               ("checkout 100", CHECKOUT, {"limit": 100}),
                               ("idle wait", IDLE, {})):
        blocks: list[int] = []
        times: list[float] = []
        for _ in range(calls):
            with engine.connect() as conn:
                before = conn.execute(BLOCKS).scalar_one()
                started = time.perf_counter()
                conn.execute(stmt, {**params, **extra}).all()
                times.append(time.perf_counter() - started)
                blocks.append(conn.execute(BLOCKS).scalar_one() - before)
                conn.rollback()
        found[label] = (int(statistics.median(blocks)), statistics.median(times))
    return found


def _vacuum(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'postjob'")).scalars():
            conn.execute(text(f'VACUUM ANALYZE postjob."{table}"'))


def _fill(engine: Engine, workflow: Any, args: list[list[Any]]) -> float:
    started = time.perf_counter()
    with Session(engine) as s:
        q = JobQueue(s, registry=sleepers, batch_size=100)
        for at in range(0, len(args), 10_000):
            q.enqueue_many(workflow, args[at:at + 10_000])
            s.commit()
            q.drain()
    return time.perf_counter() - started


def bench_sleepers(engine: Engine, sleeping: int, waiting: int, calls: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE postjob.postjobs, postjob.events CASCADE"))
        conn.execute(text("INSERT INTO postjob.postjobs (workflow, next_run_at) "
                          "SELECT 'bench.due', now() - interval '1 hour' + g * interval '1 ms' "
                          "FROM generate_series(1, 5000) g"))
    _vacuum(engine)
    alone = _measure(engine, calls)
    took = _fill(engine, nap, [[] for _ in range(sleeping)])
    took_w = _fill(engine, wait, [[f"key-{i}"] for i in range(waiting)])
    with engine.connect() as conn:
        counts = conn.execute(text(
            "SELECT count(*) FILTER (WHERE status = 'sleep'), "
            "(SELECT count(*) FROM postjob.unfinished WHERE NOT due AND run_at IS NOT NULL), "
            "(SELECT count(*) FROM postjob.event_waits) FROM postjob.postjobs")).one()
    _vacuum(engine)
    beside = _measure(engine, calls)
    print(f"sleepers: {counts[0]:,} jobs asleep ({counts[1]:,} until tomorrow, made in "
          f"{took:.0f} s; {counts[2]:,} waiting for events, made in {took_w:.0f} s) beside "
          f"5,000 due jobs; median of {calls} calls")
    for label in alone:
        (b0, t0), (b1, t1) = alone[label], beside[label]
        print(f"  {label:13s} nothing beside: {b0:4d} buffers {t0 * 1e3:6.3f} ms | "
              f"with the sleepers: {b1:4d} buffers {t1 * 1e3:6.3f} ms "
              f"(x{b1 / b0 if b0 else float('nan'):.2f} buffers, x{t1 / t0:.2f} time)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sleeping", type=int, default=100_000)
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--only", choices=("steps", "sleepers"), help="run one part only")
    parser.add_argument("--database", default="pjbench_durable", help="the scratch database")
    parser.add_argument("--async-commit", action="store_true",
                        help="synchronous_commit off in the scratch database: what a recorded "
                             "step costs without waiting for its WAL flush")
    opts = parser.parse_args()
    logging.getLogger("postjob_sa").setLevel(logging.ERROR)
    url = pg.fresh_database(opts.dsn_base, opts.database)
    if opts.async_commit:
        pg.execute(url, f'ALTER DATABASE "{opts.database}" SET synchronous_commit = off')
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    postjob_sa.migrate(engine)
    _count_statements()
    if opts.only != "sleepers":
        bench_steps(engine, opts.steps, opts.repeat)
    if opts.only != "steps":
        bench_sleepers(engine, opts.sleeping, opts.waiting, opts.calls)
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
