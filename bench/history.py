"""History at scale: reads that must not grow with the job record, density, and retention.

    .venv/bin/python bench/history.py [--jobs 1000000] [--repeat 30] [--reuse] [--build api]
    .venv/bin/python bench/history.py --drop-only

The data is built with SQL: bench/web.py's generator (``generate_series``: blocks of ten
ids, every fifth one a tree of a root, three children and six grandchildren; the oldest 98 %
settled over the past days, the newest 2 % waiting, running or asleep), written into ranges
of 1,000,000 ids made first (``postjob._history_add_range``), then each closed range of
settled jobs compacted by ``postjob.rotate_history()``, then ``VACUUM ANALYZE`` (the local
server runs with autovacuum off: every VACUUM here is explicit). The reference for the reads
is a database holding the same unfinished jobs and no history (``pjbench_history_empty``).

``--build api`` builds them through the public API instead, as an application's jobs are
made: ``enqueue_many`` and ``drain`` in this process, in chunks of 10,000 (1 % of them fail,
one in a hundred is a tree of ten: a root, three children, six grandchildren), every job
settled just now, so all of them are within the dashboard's last hour; then the newest 2 %
are enqueued and left due. The pages that show one job read its id from the database.

Measured, each after 2 untimed runs: the API's checkout of 1 and of 100 jobs (rolled back),
every dashboard page (bench/web.py's list, through the WSGI app in this process), ``postjob
ps --status failed`` and ``postjob ps ROOT`` (the command in this process: no interpreter
start), a metrics sample and scrape, and the plan of ``session.get(Job, id)``. Then the
retention figure: 200,000 finished jobs in a range of their own, dropped by a rotation.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import web
from bench.harness import pg

WORKFLOWS = ["app.send_mail", "app.thumbnail", "app.report", "app.charge", "app.sync",
             "app.export", "app.import", "app.notify", "app.cleanup", "app.index"]
RANGE = 1_000_000


def _p95(times: list[float]) -> float:
    times = sorted(times)
    return times[min(len(times) - 1, int(round(len(times) * 0.95)) - 1)]


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(median, p95) in ms of ``repeat`` calls after 2 untimed ones."""
    times = []
    for i in range(repeat + 2):
        t0 = time.perf_counter()
        fn()
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), _p95(times)


def build(url: str, total: int, settled_fraction: float) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    import postjob_sa
    from postjob_sa import JobQueue

    engine = create_engine(url)
    postjob_sa.migrate(engine)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        for start in range(RANGE, total + RANGE, RANGE):  # the ranges the ids will fill
            conn.execute(text("SELECT postjob._history_add_range(:a, :b)"),
                         {"a": start, "b": start + RANGE})
        conn.execute(text(web.GENERATE), {"total": total,
                                          "settled": int(total * settled_fraction)})
        conn.execute(text("SELECT setval('postjob.postjobs_id_seq', :n)"), {"n": total})
    built = time.perf_counter() - t0
    compacted = 0
    while True:  # one closed range of settled jobs per rotation
        with Session(engine) as s:
            report = JobQueue(s).rotate_history()
            s.commit()
        compacted += len(report.compacted)
        if not report.compacted:
            break
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE postjob.postjobs"))
        conn.execute(text("VACUUM ANALYZE postjob.unfinished"))
    engine.dispose()
    print(f"built {total:,} jobs in {built:.1f} s, {compacted} range(s) compacted, then "
          f"VACUUM ANALYZE: {time.perf_counter() - t0:.1f} s", file=sys.stderr)


QUEUES = ["q", "q", "q", "mail", "reports", "media", "billing"]
CHUNK = 10_000


def api_registry() -> Any:
    """The workflows of the API build: WORKFLOWS (no-ops), one that fails, and trees."""
    import postjob_sa
    from postjob_sa import Registry

    reg = Registry()
    for name in WORKFLOWS:
        postjob_sa.workflow(name=name, registry=reg)(lambda *args: None)

    @postjob_sa.workflow(name="app.flaky", registry=reg, max_attempts=1)
    def flaky(n: int) -> None:
        raise ConnectionError(f"host {n % 50} refused the connection")

    @postjob_sa.workflow(name="app.leaf", registry=reg)
    def leaf(n: int, i: int, k: int) -> int:
        return k

    @postjob_sa.workflow(name="app.branch", registry=reg)
    def branch(n: int, i: int) -> list[int]:
        return [h.result() for h in [leaf.spawn(n, i, k) for k in range(2)]]

    @postjob_sa.workflow(name="app.tree", registry=reg)
    def tree(n: int) -> list[list[int]]:
        return [h.result() for h in [branch.spawn(n, i) for i in range(3)]]

    return reg


def enqueue_chunk(q: Any, first: int, n: int) -> None:
    """n jobs: a tree of ten per thousand, 1 % failing, the rest no-ops, over the queues."""
    trees = n // 1000
    flat = n - trees * 10
    failing = flat // 100
    if trees:
        q.enqueue_many("app.tree", [[first + i] for i in range(trees)], queue="reports")
    q.enqueue_many("app.flaky", [[first + i] for i in range(failing)], queue="billing")
    by: dict[tuple[str, str], list[list[int]]] = {}
    for i in range(flat - failing):
        by.setdefault((WORKFLOWS[i % len(WORKFLOWS)], QUEUES[i % len(QUEUES)]), []).append(
            [first + i])
    for (name, queue), args in by.items():
        q.enqueue_many(name, args, queue=queue)


def build_api(url: str, total: int, settled_fraction: float) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    import postjob_sa
    from postjob_sa import JobQueue

    logging.getLogger("postjob_sa").setLevel(logging.ERROR)  # the failing 1 % would log
    engine = create_engine(url)
    postjob_sa.migrate(engine)
    reg = api_registry()
    settled = int(total * settled_fraction)
    t0 = time.perf_counter()
    with Session(engine) as s:
        q = JobQueue(s, registry=reg, batch_size=500)
        done = 0
        while done < settled:
            n = min(CHUNK, settled - done)
            enqueue_chunk(q, done, n)
            s.commit()
            q.drain()
            done += n
        ran = time.perf_counter() - t0
        live = total - int(s.execute(text("SELECT count(*) FROM postjob.postjobs")).scalar_one())
        for start in range(0, live, CHUNK):
            args = [[i] for i in range(start, min(live, start + CHUNK))]
            for k, name in enumerate(WORKFLOWS):
                q.enqueue_many(name, args[k::len(WORKFLOWS)], queue=QUEUES[k % len(QUEUES)])
            s.commit()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE postjob.postjobs"))
        conn.execute(text("VACUUM ANALYZE postjob.unfinished"))
    engine.dispose()
    print(f"built {total:,} jobs through the API ({settled:,} run and settled in {ran:.1f} s, "
          f"{settled / max(ran, 1e-9):,.0f} jobs/s), then VACUUM ANALYZE: "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)


def api_pages(url: str) -> list[tuple[str, str]]:
    """web.pages, with the pages of one job at ids read from the database."""
    settled_root = pg.value(url, "SELECT max(id) FROM postjob.postjobs WHERE parent_id IS NULL "
                                 "AND status = 'ok' AND id < (SELECT max(id) / 2 FROM postjob.postjobs)")
    root = int(pg.value(url, "SELECT max(id) FROM postjob.postjobs WHERE workflow = 'app.tree'"))
    leaf = pg.value(url, f"SELECT max(id) FROM postjob.postjobs WHERE root_id = {root}")
    by_name = {"job, settled root": f"/jobs/{settled_root}",
               "job, tree of 10 (sleeping)": f"/jobs/{root}",
               "job, grandchild": f"/jobs/{leaf}", "job, live refresh": f"/jobs/{root}?live=1"}
    return [(name.replace(" (sleeping)", ""), by_name.get(name, path))
            for name, path in web.pages(1_000_000)]


def database(base: str, name: str, total: int, settled: float, reuse: bool,
             api: bool = False) -> str:
    url = pg.url_for(base, name)
    count = 0
    if reuse:
        try:
            count = int(pg.value(url, "SELECT count(*) FROM postjob.postjobs"))
        except Exception:
            count = 0
    if count != total:
        pg.fresh_database(base, name)
        (build_api if api else build)(
            url.replace("postgresql://", "postgresql+psycopg2://", 1), total, settled)
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


def checkouts(url: str, repeat: int) -> dict[int, float]:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    import postjob_sa
    from postjob_sa import JobQueue, Registry

    reg = Registry()
    for name in WORKFLOWS:  # the workflows the generator's jobs run (version '')
        postjob_sa.workflow(name=name, registry=reg)(lambda *args: None)
    engine = create_engine(url)
    out = {}
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        for n in (1, 100):
            def one(n: int = n) -> None:
                assert q.checkout(WORKFLOWS, limit=n)
                s.rollback()
            out[n] = timed(one, repeat)[0]
    engine.dispose()
    return out


def reads(url: str, total: int, repeat: int, api: bool = False) -> list[tuple[str, float, float]]:
    from click.testing import CliRunner
    from sqlalchemy import create_engine, select, text
    from werkzeug.test import Client

    from postjob_sa import Job
    from postjob_sa.cli import cli
    from postjob_sa.metrics import PostjobCollector
    from postjob_sa.web import create_app

    engine = create_engine(url, pool_size=2)
    rows: list[tuple[str, float, float]] = []
    client = Client(create_app(engine))
    plain = url.replace("postgresql+psycopg2://", "postgresql://", 1)
    pages = api_pages(plain) if api else web.pages(total)
    for name, path in pages:
        def page(path: str = path) -> None:
            assert client.get(path).status_code == 200
        rows.append((f"dashboard: {name}", *timed(page, repeat)))
    runner = CliRunner()
    tree_root = pages[14][1].rsplit("/", 1)[1]
    for name, args in (("ps --status failed", ["ps", "--status", "failed"]),
                       ("ps of a tree", ["ps", tree_root])):
        def ps(args: list[str] = args) -> None:
            res = runner.invoke(cli, ["--database-url", plain, *args])
            assert res.exit_code == 0, res.output
        rows.append((name, *timed(ps, repeat)))
    collector = PostjobCollector(None)
    collector.engine = engine
    rows.append(("metrics: sample (every 15 s)", *timed(collector.refresh, repeat)))
    rows.append(("metrics: scrape", *timed(lambda: list(collector.collect()), repeat)))
    with engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.execute(text(
            "EXPLAIN " + str(select(Job).where(Job.id == total // 2).compile(
                engine, compile_kwargs={"literal_binds": True})))))
    touched = plan.count(" on postjobs_")
    print(f"session.get(Job, {total // 2}): the plan reads {touched} range(s) of the record")
    engine.dispose()
    return rows


def density(url: str) -> None:
    rows = pg.execute(url.replace("postgresql+psycopg2://", "postgresql://", 1), """
        SELECT c.relname, COALESCE((SELECT o.option_value FROM pg_options_to_table(c.reloptions) o
                                    WHERE o.option_name = 'fillfactor'), '')::text,
               c.reltuples::bigint, pg_total_relation_size(c.oid)
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'postjob.postjobs'::regclass ORDER BY c.relname""")
    for name, fill, jobs, size in rows:
        if jobs > 0:
            print(f"{name}: fillfactor {fill or 'default'}, {jobs:,} jobs, "
                  f"{size / jobs:.0f} bytes per job (indexes included)")


def drop(base: str, jobs: int = 200_000) -> None:
    """200,000 finished jobs in a range of their own, dropped by a rotation."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    import postjob_sa
    from postjob_sa import JobQueue

    url = pg.fresh_database(base, "pjbench_history_drop").replace(
        "postgresql://", "postgresql+psycopg2://", 1)
    engine = create_engine(url)
    postjob_sa.migrate(engine)
    with engine.begin() as conn:
        conn.execute(text("SELECT postjob._history_add_range(1000000, :b)"), {"b": RANGE + jobs})
        conn.execute(text(
            "INSERT INTO postjob.postjobs (id, root_id, full_id, workflow, args, status, results, "
            "created_at, updated_at, queued) SELECT i, i, i::text, 'app.noop', '[]', 'ok', "
            "'[null]', now() - interval '2 days', now() - interval '2 days', true "
            "FROM generate_series(1000000, :last) i"), {"last": RANGE + jobs - 1})
        conn.execute(text("SELECT setval('postjob.postjobs_id_seq', :n)"), {"n": RANGE + jobs})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE postjob.postjobs"))
        before = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    with Session(engine) as s:
        JobQueue(s).set_history(keep=timedelta(days=1), partition_size=jobs)
        s.commit()
    t0 = time.perf_counter()
    with Session(engine) as s:
        report = JobQueue(s).rotate_history()
        s.commit()
    elapsed = time.perf_counter() - t0
    with engine.connect() as conn:
        after = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    engine.dispose()
    freed = before - after
    print(f"retention: rotation dropped {report.jobs_dropped:,} finished jobs "
          f"({', '.join(report.dropped)}) in {elapsed * 1000:.0f} ms (commit included); "
          f"the database went from {before / 1e6:.1f} MB to {after / 1e6:.1f} MB: "
          f"{freed / 1e6:.1f} MB returned")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--reuse", action="store_true", help="keep databases that have the jobs")
    parser.add_argument("--drop-only", action="store_true", help="only the retention figure")
    parser.add_argument("--build", choices=["sql", "api"], default="sql",
                        help="build the jobs with SQL (default) or through the public API")
    opts = parser.parse_args()
    if opts.drop_only:
        drop(opts.dsn_base)
        return 0
    api = opts.build == "api"
    suffix = "_api" if api else ""
    live = opts.jobs - int(opts.jobs * 0.98)
    empty = database(opts.dsn_base, f"pjbench_history_empty{suffix}", live, 0.0, opts.reuse, api)
    full = database(opts.dsn_base, f"pjbench_history{suffix}_{opts.jobs}", opts.jobs, 0.98,
                    opts.reuse, api)
    version = pg.value(pg.url_for(opts.dsn_base, "postgres"), "SHOW server_version")
    print(f"history at {opts.jobs:,} jobs (98 % finished), built with {opts.build.upper()}, "
          f"PostgreSQL {version}, {opts.repeat} runs each after 2 untimed\n")
    base, loaded = checkouts(empty, opts.repeat), checkouts(full, opts.repeat)
    print("| checkout (API, rolled back) | no history, ms | with history, ms | ratio |")
    print("|---|---:|---:|---:|")
    for n in (1, 100):
        print(f"| {n} job(s) | {base[n]:.2f} | {loaded[n]:.2f} | {loaded[n] / base[n]:.2f} |")
    print("\n| read | median ms | p95 ms |\n|---|---:|---:|")
    worst = 0.0
    for name, median, p95 in reads(full, opts.jobs, opts.repeat, api):
        worst = max(worst, p95)
        print(f"| {name} | {median:.1f} | {p95:.1f} |")
    print(f"\nworst p95: {worst:.1f} ms (budget 100 ms)")
    density(full)
    drop(opts.dsn_base)
    ratio = max(loaded[n] / base[n] for n in (1, 100))
    return 0 if worst <= 100 and ratio <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
