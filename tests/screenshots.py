"""Screenshots of the dashboard for docs/dashboard.md: ``make screenshots``.

Builds a scratch database (``pjshots``) on the test server (``POSTJOB_TEST_DATABASE_URL``,
else the local one), fills it by running the workflows of ``tests/web_data.py`` plus an hour
of settled history, serves the dashboard, and has headless Chromium save the main pages
into docs/img/.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psycopg2
from psycopg2 import sql as pgsql
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue
from postjob_sa.web import create_app
from tests.web.test_web_browser import CHROMIUM, Served, launch
from tests.web_data import backdate, noop, seed

OUT = Path(__file__).resolve().parent.parent / "docs" / "img"
DB = "pjshots"

HISTORY = text(
    "INSERT INTO postjob.postjobs (workflow, queue, args, status, results, error, error_message, "
    "created_at, updated_at, next_run_at) "
    "SELECT (ARRAY['web.label', 'web.pack', 'mail.send', 'report.build'])[1 + i % 4], "
    "(ARRAY['q', 'q', 'mail', 'reports'])[1 + i % 4], jsonb_build_array(i), "
    "CAST(CASE WHEN i % 53 = 0 THEN 'failed' WHEN i % 211 = 0 THEN 'timeout' ELSE 'ok' END "
    "     AS postjob.statuses), "
    "CASE WHEN i % 53 <> 0 AND i % 211 <> 0 THEN '[true]'::jsonb END, "
    "CASE WHEN i % 53 = 0 THEN 'ConnectionError' END, "
    "CASE WHEN i % 53 = 0 THEN 'smtp.example.com refused the connection' END, "
    "now() - make_interval(secs => m * 60 + 30), now() - make_interval(secs => m * 60 + 20), NULL "
    "FROM generate_series(0, 59) AS m, "
    "generate_series(1, 20 + (12 * (1 + sin(m / 6.0)))::int) AS i"
)


def build(url: str) -> None:
    engine = create_engine(url)
    postjob_sa.migrate(engine)
    with engine.begin() as conn:
        conn.execute(HISTORY)
    seed(engine)
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True)
        for n in (8, 9):
            q.enqueue("web.order", n)
        q.enqueue_many(noop, [[i] for i in range(40)], queue="mail")
        s.commit()
        q.drain()
        q.enqueue_many(noop, [[i] for i in range(25)], queue="mail")
        s.commit()
    # a worker in the middle of a job: its connection named as workers name theirs
    backdate(engine, 150)  # long enough for the overview to call a job stranded
    with Session(engine) as s:
        held = JobQueue(s, identifier="app-host-1:4242").checkout(["web.noop"], limit=2)
        # its heartbeat, as a running worker keeps it (and a pooled one, seen by it alone)
        s.execute(text(
            "INSERT INTO postjob.workers (identifier, heartbeat_at, expires_at, code_revision) "
            "VALUES ('app-host-1:4242', now(), now() + interval '1 minute', 'pj0004'), "
            "('app-host-2:311', now(), now() + interval '1 minute', 'pj0004')"))
        s.commit()
        assert held
    # limits as `postjob queue limit` sets them, schedules as workers register them
    with Session(engine) as s:
        q = JobQueue(s)
        q.set_queue_limits("mail", concurrency=2, rate=600, period=60)
        q.set_queue_limits("reports", rate=10, period=3600)
        s.execute(text(
            "INSERT INTO postjob.schedules (name, cron, timezone, every, skip_missed, next_tick_at, "
            "last_run_at, last_job_id) VALUES "
            "('web.order', '0 3 * * *', 'Europe/Zurich', NULL, false, "
            " date_trunc('day', now()) + interval '1 day 2 hours', "
            " date_trunc('day', now()) + interval '2 hours', "
            " (SELECT min(id) FROM postjob.jobs WHERE workflow = 'web.order')), "
            "('web.noop', NULL, NULL, 300, true, now() + interval '3 minutes', "
            " now() - interval '2 minutes', (SELECT max(id) FROM postjob.jobs WHERE workflow = 'web.noop'))"))
        s.commit()
    engine.dispose()


def main() -> int:
    server = make_url(os.environ.get("POSTJOB_TEST_DATABASE_URL", "postgresql://root@127.0.0.1:5432/test"))
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(DB)))
        cur.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(DB)))
    conn.close()
    url = server.set(drivername="postgresql+psycopg2", database=DB)
    build(url.render_as_string(hide_password=False))
    worker = psycopg2.connect(url.set(drivername="postgresql").render_as_string(hide_password=False),
                              application_name="postjob worker app-host-1:4242")
    engine = create_engine(url)
    served = Served(create_app(engine, refresh=0))
    OUT.mkdir(parents=True, exist_ok=True)
    with engine.connect() as c:
        root = c.execute(text("SELECT min(id) FROM postjob.jobs WHERE workflow = 'web.order'")).scalar()
        failed = c.execute(text("SELECT min(id) FROM postjob.jobs WHERE workflow = 'web.flaky'")).scalar()
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: apt-get install chromium", file=sys.stderr)
        return 1
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            for name, path, full in [
                ("overview", "/", True),
                ("jobs", "/jobs?queue=q", False),
                ("tree", f"/jobs/{root}", True),
                ("failed", f"/jobs/{failed}", True),
                ("schedules", "/schedules", True),
            ]:
                page.goto(served.url + path)
                page.wait_for_timeout(300)
                page.screenshot(path=str(OUT / f"dashboard-{name}.png"), full_page=full)
                print(f"docs/img/dashboard-{name}.png")
            browser.close()
    finally:
        served.stop()
        worker.close()
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
