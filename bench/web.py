"""The dashboard's server time per page at 1,000,000 jobs.

    .venv/bin/python bench/web.py [--jobs 1000000] [--repeat 20] [--reuse]
    make bench-web

Builds a scratch database ``pjbench_web`` (dropped and created again unless ``--reuse``)
with ``generate_series``: blocks of ten ids, every fifth block one tree (a root, three
children, six grandchildren), the others ten root jobs; the oldest 98 % settled over the
past days (1 % failed, 0.2 % timed out, the rest ok; one job finished every 0.5 s, so 7,200
in the last hour), the newest 2 % waiting (ready, retrying, processing, sleeping trees with
manual steps). Then VACUUM ANALYZE, and each page is requested through the WSGI app in this
process (rendering included, network excluded): 2 untimed, then ``--repeat`` timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import pg

DB = "pjbench_web"
BUDGET_MS = 100.0

GENERATE = """
INSERT INTO postjob.postjobs (
  id, parent_id, root_id, full_id, created_at, updated_at, queue, workflow, args, status,
  next_run_at, failed_attempts, results, error, error_message, error_backtrace, tags,
  awaiting_id, processing_client, processing_client_identifier, processing_started_at,
  lease_expires_at, lease_token)
SELECT g.id, g.parent_id, COALESCE(g.root, g.id), g.full_id,
  g.created, g.created + make_interval(secs => 0.2 + (g.id % 97) / 10.0),
  (ARRAY['q', 'q', 'q', 'mail', 'reports', 'media', 'billing'])[1 + g.id % 7],
  CASE WHEN g.tree AND g.o >= 4 AND g.live THEN '__manual__'
       ELSE (ARRAY['app.send_mail', 'app.thumbnail', 'app.report', 'app.charge', 'app.sync',
                   'app.export', 'app.import', 'app.notify', 'app.cleanup', 'app.index'])[1 + g.id % 10] END,
  jsonb_build_array(g.id, 'customer-' || (g.id % 5000)),
  g.status::postjob.statuses,
  CASE WHEN g.status IN ('ready', 'err') THEN g.created + make_interval(secs => (g.id % 600) - 300) END,
  CASE WHEN g.status IN ('err', 'failed') THEN 1 + g.id % 4 ELSE 0 END,
  CASE WHEN g.status = 'ok' THEN jsonb_build_array(jsonb_build_object('done', g.id)) END,
  CASE WHEN g.status IN ('err', 'failed') THEN 'ConnectionError' END,
  CASE WHEN g.status IN ('err', 'failed') THEN 'host ' || (g.id % 50) || ' refused the connection' END,
  CASE WHEN g.status IN ('err', 'failed') THEN jsonb_build_array(
    'app/jobs.py:42:in run', 'app/net.py:7:in connect', 'socket.py:851:in create_connection') END,
  CASE WHEN g.id % 10 = 3 THEN jsonb_build_object('customer', (g.id % 1000)::text) END,
  CASE WHEN g.status = 'sleep' THEN g.id + 1 END,
  CASE WHEN g.status = 'processing' THEN '10.0.0.' || (g.id % 4) || ':' || '5432' END,
  CASE WHEN g.status = 'processing' THEN 'worker-' || (g.id % 4) || ':' || (1000 + g.id % 4) END,
  CASE WHEN g.status = 'processing' THEN now() - interval '5 seconds' END,
  CASE WHEN g.status = 'processing' THEN now() + interval '55 seconds' END,
  CASE WHEN g.status = 'processing' THEN g.id END
FROM (
  SELECT s.id, s.o, s.tree, s.live, s.created,
    CASE WHEN NOT s.tree OR s.o = 0 THEN NULL
         WHEN s.o <= 3 THEN s.base ELSE s.base + 1 + (s.o - 4) % 3 END AS parent_id,
    CASE WHEN s.tree THEN s.base END AS root,
    CASE WHEN NOT s.tree OR s.o = 0 THEN s.id::text
         WHEN s.o <= 3 THEN s.base || '.' || s.id
         ELSE s.base || '.' || (s.base + 1 + (s.o - 4) % 3) || '.' || s.id END AS full_id,
    CASE
      WHEN s.live AND s.tree THEN (CASE WHEN s.o <= 3 THEN 'sleep' ELSE 'ready' END)
      WHEN s.live THEN (ARRAY['ready', 'ready', 'ready', 'ready', 'err', 'processing', 'ready',
                              'ready', 'ready', 'ready'])[1 + s.id % 10]
      WHEN s.id % 97 = 0 THEN 'failed'
      WHEN s.id % 499 = 0 THEN 'timeout'
      ELSE 'ok' END AS status
  FROM (
    SELECT i AS id, (i - 1) % 10 AS o, (i - 1) / 10 * 10 + 1 AS base,
      ((i - 1) / 10) % 5 = 0 AS tree, i > :settled AS live,
      CASE WHEN i > :settled THEN now() - make_interval(secs => (:total - i) * 0.3)
           ELSE now() - make_interval(secs => (:settled - i) * 0.5 + 20) END AS created
    FROM generate_series(1, :total) AS i
  ) s
) g
"""


def build(url: str, total: int) -> None:
    from sqlalchemy import create_engine, text

    import postjob_sa

    engine = create_engine(url)
    postjob_sa.migrate(engine)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text(GENERATE), {"total": total, "settled": int(total * 0.98)})
        conn.execute(text("SELECT setval('postjob.postjobs_id_seq', :n)"), {"n": total})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE postjob.postjobs"))
    engine.dispose()
    print(f"built {total:,} jobs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def pages(total: int) -> list[tuple[str, str]]:
    live = int(total * 0.98) + 1
    tree_root = next(i for i in range(live, total) if (i - 1) % 10 == 0 and ((i - 1) // 10) % 5 == 0)
    return [
        ("overview", "/"),
        ("overview, live refresh", "/?live=1"),
        ("jobs, newest", "/jobs"),
        ("jobs, page at id 500,000", "/jobs?before=500000"),
        ("jobs, status failed", "/jobs?status=failed"),
        ("jobs, status sleep", "/jobs?status=sleep"),
        ("jobs, ready + retrying", "/jobs?status=ready&status=err"),
        ("jobs, queue billing + ok", "/jobs?queue=billing&status=ok"),
        ("jobs, workflow app.report", "/jobs?workflow=app.report"),
        ("jobs, tag customer:3", "/jobs?tag=customer:3"),
        ("jobs, no match (full window)", "/jobs?workflow=nothing.matches"),
        ("jobs, newer than 1h", "/jobs?newer=1h"),
        ("jobs, older than 24h", "/jobs?older=24h"),
        ("job, settled root", f"/jobs/{total // 2 + 3}"),
        ("job, tree of 10 (sleeping)", f"/jobs/{tree_root}"),
        ("job, grandchild", f"/jobs/{tree_root + 9}"),
        ("job, live refresh", f"/jobs/{tree_root}?live=1"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn-base", default="postgresql://root@127.0.0.1:5432")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--reuse", action="store_true", help="keep pjbench_web if it has the jobs")
    opts = parser.parse_args()

    from sqlalchemy import create_engine, text
    from werkzeug.test import Client

    from postjob_sa.web import create_app

    url = pg.url_for(opts.dsn_base, DB).replace("postgresql://", "postgresql+psycopg2://", 1)
    count = 0
    if opts.reuse:
        try:
            count = int(pg.value(pg.url_for(opts.dsn_base, DB), "SELECT count(*) FROM postjob.postjobs"))
        except Exception:
            count = 0
    if count != opts.jobs:
        pg.fresh_database(opts.dsn_base, DB)
        build(url, opts.jobs)

    engine = create_engine(url, pool_size=2)
    with engine.connect() as conn:
        version = conn.execute(text("SHOW server_version")).scalar()
    client = Client(create_app(engine))
    print(f"postjob dashboard, server time per page: {opts.jobs:,} jobs, PostgreSQL {version}, "
          f"{opts.repeat} requests each after 2 untimed\n")
    print(f"| {'page':<30} | median ms | p95 ms | max ms | KiB |")
    print(f"|{'-' * 32}|----------:|-------:|-------:|----:|")
    worst = 0.0
    for name, path in pages(opts.jobs):
        times = []
        size = 0
        for i in range(opts.repeat + 2):
            t0 = time.perf_counter()
            response = client.get(path)
            elapsed = (time.perf_counter() - t0) * 1000
            assert response.status_code == 200, (path, response.status_code)
            size = len(response.get_data())
            if i >= 2:
                times.append(elapsed)
        times.sort()
        p95 = times[min(len(times) - 1, int(round(len(times) * 0.95)) - 1)]
        worst = max(worst, p95)
        print(f"| {name:<30} | {statistics.median(times):9.1f} | {p95:6.1f} | {times[-1]:6.1f} | {size / 1024:3.0f} |")
    print(f"\nworst p95: {worst:.1f} ms (budget {BUDGET_MS:.0f} ms)")
    engine.dispose()
    return 0 if worst <= BUDGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
