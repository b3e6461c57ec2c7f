#!/usr/bin/env python3
"""I/O-bound jobs, one worker process running many at once, side by side.

Each job waits 10 ms (``asyncio.sleep`` in async jobs, ``time.sleep`` in threads) and nothing
else: the figure is how well a worker keeps its slots busy. One worker process per run, with
in-process concurrency C (default 50); the ideal is C / 10 ms = 5,000 jobs/s. Systems:
postjob_sa with an ``async def`` workflow (tasks on its event loop) and with a sync one
(threads), procrastinate (``concurrency=C``), pgqueuer (``concurrency_limit=C``, batches of
C). Also: enqueue through ``AsyncSession``, one job per transaction, beside a sync Session.

    .venv-bench/bin/python bench/io.py [--jobs 10000] [--reps 3] [--concurrency 50]

Prints a markdown table; ``--output`` writes the JSON rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
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

SYSTEMS = ("postjob_sa-async", "postjob_sa-threads", "procrastinate", "pgqueuer")


# -- the jobs and the workers (run in a child process: `io.py --child SYSTEM`) ------------------

def _postjob_registry(sleep_s: float) -> Any:
    import postjob_sa

    reg = postjob_sa.Registry()

    @postjob_sa.workflow(name="io.async", registry=reg)
    async def io_async(key: int) -> None:
        await asyncio.sleep(sleep_s)

    @postjob_sa.workflow(name="io.thread", registry=reg)
    def io_thread(key: int) -> None:
        time.sleep(sleep_s)

    return reg


def _procrastinate_app(url: str, sleep_s: float) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="io_sleep")
    async def io_sleep(key: int) -> None:
        await asyncio.sleep(sleep_s)

    return app


def _child(system: str, url: str, concurrency: int, sleep_s: float) -> None:
    """Get ready, wait for the go on stdin, drain, print wall time and CPU as JSON."""
    if system.startswith("postjob_sa"):
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        import postjob_sa

        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        reg = _postjob_registry(sleep_s)
        queue = postjob_sa.JobQueue(Session(engine), registry=reg, concurrency=concurrency)
        with engine.connect():
            pass
        run: Any = queue.drain
    elif system == "procrastinate":
        app = _procrastinate_app(url, sleep_s)

        async def go_procrastinate() -> None:
            async with app.open_async():
                await app.run_worker_async(concurrency=concurrency, wait=False,
                                           install_signal_handlers=False)

        def run() -> None:
            asyncio.run(go_procrastinate())
    else:
        async def go_pgqueuer() -> None:
            import asyncpg
            from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
            from pgqueuer.types import QueueExecutionMode

            conn = await asyncpg.connect(url)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))  # as bench/systems/pgqueuer.py

            @qm.entrypoint("io_sleep", concurrency_limit=concurrency)
            async def io_sleep(job: Job) -> None:
                await asyncio.sleep(sleep_s)

            await qm.run(batch_size=concurrency, mode=QueueExecutionMode.drain)
            await conn.close()

        def run() -> None:
            asyncio.run(go_pgqueuer())

    print("ready", flush=True)
    sys.stdin.readline()
    cpu0 = _cpu()
    t0 = time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    print(json.dumps({"wall_s": wall, "cpu_s": _cpu() - cpu0}), flush=True)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the parent: databases, jobs, one child per run ---------------------------------------------

def _prepare(system: str, url: str, jobs: int, sleep_s: float) -> None:
    """A fresh schema holding `jobs` due jobs of the system's I/O task."""
    if system.startswith("postjob_sa"):
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        import postjob_sa

        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        postjob_sa.migrate(engine)
        pg.execute(url, "TRUNCATE postjob.postjobs, postjob.tokens, postjob.workers CASCADE")
        name = "io.async" if system.endswith("async") else "io.thread"
        with Session(engine) as s:
            postjob_sa.JobQueue(s).enqueue_many(name, [[i] for i in range(jobs)])
            s.commit()
        engine.dispose()
    elif system == "procrastinate":
        app = _procrastinate_app(url, sleep_s)

        async def go() -> None:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                task = app.tasks["io_sleep"]
                for i in range(0, jobs, 1000):
                    await task.batch_defer_async(*[{"key": k} for k in range(i, min(jobs, i + 1000))])

        asyncio.run(go())
    else:
        async def go_pgq() -> None:
            import asyncpg
            from pgqueuer import AsyncpgDriver, Queries

            conn = await asyncpg.connect(url)
            q = Queries(AsyncpgDriver(conn))
            await q.install()
            for i in range(0, jobs, 1000):
                n = min(jobs, i + 1000) - i
                await q.enqueue(["io_sleep"] * n, [str(k).encode() for k in range(i, i + n)], [0] * n)
            await conn.close()

        asyncio.run(go_pgq())
    pg.execute(url, "VACUUM ANALYZE", "CHECKPOINT")


def _done(system: str, url: str) -> int:
    if system.startswith("postjob_sa"):
        return int(pg.value(url, "SELECT count(*) FROM postjob.postjobs WHERE status = 'ok'"))
    if system == "procrastinate":
        return int(pg.value(url, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"))
    return int(pg.value(url, "SELECT count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'"))


def run_once(system: str, base: str, jobs: int, concurrency: int, sleep_s: float) -> dict[str, float]:
    url = pg.fresh_database(base, "pjbench_io_" + system.replace("-", "_"))
    _prepare(system, url, jobs, sleep_s)
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", system, "--url", url, "--concurrency",
         str(concurrency), "--sleep-ms", str(sleep_s * 1000)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.stdin.write("go\n")
    child.stdin.flush()
    result = json.loads(child.stdout.readline())
    child.wait(timeout=60)
    done = _done(system, url)
    if done != jobs:
        raise RuntimeError(f"{system}: {done} of {jobs} jobs done")
    return {"jobs_per_s": jobs / result["wall_s"], "cpu_us_per_job": result["cpu_s"] / jobs * 1e6}


def enqueue_one_per_txn(base: str, jobs: int) -> dict[str, float]:
    """postjob_sa enqueue, one job per transaction: Session and AsyncSession."""
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import Session

    import postjob_sa

    url = pg.fresh_database(base, "pjbench_io_enqueue")
    sync_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(sync_url)
    postjob_sa.migrate(engine)
    out: dict[str, float] = {}
    with Session(engine) as s:
        q = postjob_sa.JobQueue(s)
        q.enqueue("io.async", -1)
        s.commit()
        t0 = time.perf_counter()
        for i in range(jobs):
            q.enqueue("io.async", i)
            s.commit()
        out["Session"] = jobs / (time.perf_counter() - t0)
    engine.dispose()

    async def go() -> float:
        aengine = create_async_engine(sync_url)
        try:
            async with AsyncSession(aengine) as s:
                q = postjob_sa.AsyncJobQueue(s)
                await q.enqueue("io.async", -1)
                await s.commit()
                t0 = time.perf_counter()
                for i in range(jobs):
                    await q.enqueue("io.async", i)
                    await s.commit()
                return jobs / (time.perf_counter() - t0)
        finally:
            await aengine.dispose()

    out["AsyncSession"] = asyncio.run(go())
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--sleep-ms", type=float, default=10.0)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--enqueue-jobs", type=int, default=2000)
    p.add_argument("--dsn-base", default=os.environ.get("PJBENCH_DSN_BASE", "postgresql://root@127.0.0.1:5432"))
    p.add_argument("--output")
    p.add_argument("--child")
    p.add_argument("--url")
    opts = p.parse_args()
    sleep_s = opts.sleep_ms / 1000
    if opts.child:
        _child(opts.child, opts.url, opts.concurrency, sleep_s)
        return 0
    ideal = opts.concurrency / sleep_s
    rows: list[dict[str, Any]] = []
    print(f"I/O-bound jobs ({opts.sleep_ms:g} ms each), one worker process, concurrency "
          f"{opts.concurrency}, {opts.jobs} jobs, median of {opts.reps}; ideal {ideal:,.0f} jobs/s\n")
    print("| system | jobs/s | of ideal | worker CPU per job |")
    print("|---|---:|---:|---:|")
    for system in opts.systems.split(","):
        runs = [run_once(system, opts.dsn_base, opts.jobs, opts.concurrency, sleep_s)
                for _ in range(opts.reps)]
        rate = statistics.median(r["jobs_per_s"] for r in runs)
        cpu = statistics.median(r["cpu_us_per_job"] for r in runs)
        rows.append({"system": system, "jobs_per_s": rate, "cpu_us_per_job": cpu, "runs": runs})
        print(f"| {system} | {rate:,.0f} | {rate / ideal:.0%} | {cpu:,.0f} µs |", flush=True)
    enq = enqueue_one_per_txn(opts.dsn_base, opts.enqueue_jobs)
    print(f"\npostjob_sa enqueue, one job per transaction ({opts.enqueue_jobs} jobs): "
          f"Session {enq['Session']:,.0f}/s, AsyncSession {enq['AsyncSession']:,.0f}/s")
    rows.append({"system": "postjob_sa", "enqueue_one_per_txn": enq})
    if opts.output:
        with open(opts.output, "w") as fh:
            json.dump({"concurrency": opts.concurrency, "sleep_ms": opts.sleep_ms,
                       "jobs": opts.jobs, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
