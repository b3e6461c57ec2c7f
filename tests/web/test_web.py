"""The dashboard's pages and actions against a real database, through a WSGI test client."""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from werkzeug.test import Client, TestResponse

from postjob_sa import InvalidArgument, JobQueue, Status, _hot_tables
from postjob_sa.web import create_app, job_queries
from tests.conftest import end_by_hand
from tests.web_data import XSS, Seeded, backdate, noop, order, seed

TOKEN = "correct horse battery"


@pytest.fixture
def seeded(engine: Engine, clean: None) -> Seeded:
    return seed(engine)


@pytest.fixture
def client(engine: Engine) -> Client:
    return Client(create_app(engine))


def status_of(engine: Engine, job_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                                {"i": job_id}).scalar_one())


def csrf(client: Client) -> str:
    client.get("/")
    cookie = client.get_cookie("postjob_csrf")
    assert cookie is not None
    return cookie.value


def post(client: Client, path: str, data: dict[str, str] | None = None, **kwargs: object) -> TestResponse:
    return client.post(path, data={"csrf": csrf(client), **(data or {})}, **kwargs)  # type: ignore[arg-type]


def body(response: TestResponse) -> str:
    return response.get_data(as_text=True)


# -- pages -----------------------------------------------------------------------------------


def test_overview_counts_queues_workers_and_waiting(client: Client, seeded: Seeded) -> None:
    page = body(client.get("/"))
    assert "Overview" in page
    counts = page[page.index('data-fragment="queues"'):page.index('data-fragment="throughput"')]
    assert ">q<" in counts and ">reports<" in counts
    assert "ok jobs in all: 3" in page  # two labels and the pack
    assert "failed 2" in page  # the throughput legend: flaky twice
    assert "0</strong> workers up" in page
    assert "approve order" in page  # the manual step waits for a token
    # due, but not for a minute yet: not stranded
    assert "web.nobody_runs_this" not in page[page.index('data-fragment="stranded"'):]


def test_the_overview_has_a_column_for_every_state_of_the_enum(client: Client, engine: Engine,
                                                              clean: None) -> None:
    """Issue 24 item 15: the columns come from Status (ok apart, as the last hour's count),
    and a queue whose jobs were all cancelled is listed with them."""
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue(noop, queue="called-off").id
        s.commit()
        JobQueue(s).cancel(job_id)
        s.commit()
    page = body(client.get("/"))
    counts = page[page.index('data-fragment="queues"'):page.index('data-fragment="throughput"')]
    head = re.findall(r'<th class="num"><span class="dot st-(\w+)">', counts)
    assert sorted(head) == sorted(s.value for s in Status)
    assert head[-1] == Status.ok.value  # "ok, last hour"
    row = counts[counts.index(">called-off<"):counts.index("</tr>", counts.index(">called-off<"))]
    cells = re.findall(r'<td class="num">(.*?)</td>', row, re.S)
    assert re.search(r">1</a>", cells[1 + head.index("cancelled")])  # after "due now"
    legend = page[page.index('class="legend"'):]
    assert "cancelled" in legend[:legend.index("</p>")]  # the last hour's chart has it too


def test_a_pending_manual_step_is_not_due_work(client: Client, engine: Engine, clean: None) -> None:
    """Issue 26: with only a manual step pending, the overview showed "due now 1" beside "every
    due job is being taken up". A step waits for a person's token, not for a worker."""
    with Session(engine) as s:
        root = JobQueue(s).enqueue(order, 7).id
        s.commit()
        JobQueue(s, fast_mode=True).drain()
    assert status_of(engine, root) == "sleep"
    page = body(client.get("/"))
    counts = page[page.index('data-fragment="queues"'):page.index('data-fragment="throughput"')]
    row = counts[counts.index(">q<"):counts.index("</tr>", counts.index(">q<"))]
    due_now = re.findall(r'<td class="num">(.*?)</td>', row, re.S)[0]
    assert due_now.strip() == ""
    waiting = page[page.index('data-fragment="waiting"'):page.index('data-fragment="workers"')]
    assert "No job is waiting for a worker." in waiting and "approve order" in waiting


def test_the_last_hour_is_read_once_per_window_not_on_every_refresh(engine: Engine,
                                                                   seeded: Seeded) -> None:
    """The throughput of the last hour is counted by minute: a dashboard reuses it for a
    while instead of reading it on every refresh."""
    app = create_app(engine)
    client = Client(app)
    legend = re.compile(r'st-ok"></span>ok ([\d,]+)')
    (before,) = legend.findall(body(client.get("/")))
    with Session(engine) as s:
        JobQueue(s).enqueue(noop)
        s.commit()
        assert JobQueue(s, fast_mode=True).drain() == 1
    assert legend.findall(body(client.get("/"))) == [before]  # reused
    app.throughput.seconds = 0  # the window is over
    assert legend.findall(body(client.get("/"))) == [str(int(before) + 1)]


def test_overview_lists_jobs_no_running_worker_runs(client: Client, seeded: Seeded, engine: Engine) -> None:
    backdate(engine, 120)
    stranded = body(client.get("/")).split('data-fragment="stranded"', 1)[1]
    assert "No worker is up" in stranded
    assert "web.nobody_runs_this" in stranded
    assert "__manual__" not in stranded  # a manual step waits for a person, not a worker


def test_workers_are_seen_by_their_heartbeat_too(client: Client, seeded: Seeded, engine: Engine) -> None:
    """A pooled worker's connections carry the pooler's name: its heartbeat row shows it up."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO postjob.workers (identifier, heartbeat_at, expires_at, code_revision) VALUES "
            "('pooled-host:7', now(), now() + interval '1 minute', 'pj0004'), "
            "('crashed-host:9', now() - interval '5 minutes', now() - interval '4 minutes', 'pj0004')"))
    backdate(engine, 120)
    page = body(client.get("/"))
    workers = page[page.index('data-fragment="workers"'):page.index('data-fragment="stranded"')]
    assert "1</strong> worker up" in workers
    pooled = workers[workers.index("pooled-host:7"):workers.index("</tr>", workers.index("pooled-host:7"))]
    assert "pooled: not by name" in pooled and "stopped" not in pooled
    crashed = workers[workers.index("crashed-host:9") - 40:workers.index("</tr>", workers.index("crashed-host:9"))]
    # its heartbeat ended without it unregistering: it died (a worker that stops unregisters,
    # and is no longer listed)
    assert 'class="gone"' in crashed and "died" in crashed and "not connected" in crashed
    assert "stopped" not in crashed
    assert "A worker that stops unregisters" in workers
    stranded = page.split('data-fragment="stranded"', 1)[1]
    assert "No worker is up" not in stranded and "web.nobody_runs_this" in stranded


def test_jobs_list_filters(client: Client, seeded: Seeded) -> None:
    def ids(query: str) -> list[int]:
        response = client.get("/jobs" + query)
        assert response.status_code == 200, body(response)
        return [int(m) for m in re.findall(r'href="/jobs/(\d+)"', body(response).split("<table", 1)[1])]

    assert ids("?status=failed") == [seeded.xss, seeded.failed]
    assert ids("?status=sleep") == [seeded.order]
    assert ids("?queue=reports") == [seeded.stranded]
    assert ids("?workflow=web.label") == sorted(seeded.labels, reverse=True)
    assert ids("?tag=customer:acme") == [seeded.order]
    assert set(ids("?newer=5m")) >= {seeded.order, seeded.stranded}
    assert ids("?older=1h") == []


@pytest.mark.parametrize("query", ["?status=nope", "?tag=nocolon", "?newer=3m", "?before=x1", "?id=12a"])
def test_jobs_list_rejects_bad_filters(client: Client, seeded: Seeded, query: str) -> None:
    response = client.get("/jobs" + query)
    assert response.status_code == 400
    assert "problem" in body(response)


def test_keyset_pages_cover_every_job_once(engine: Engine, clean: None) -> None:
    with Session(engine) as s:
        JobQueue(s).enqueue_many(noop, [[i] for i in range(7)])
        s.commit()
    app = create_app(engine)
    app.settings.page_size = 3
    client, seen, url = Client(app), [], "/jobs"
    while url:
        page = body(client.get(url))
        seen += [int(m) for m in re.findall(r'<td class="num"><a href="/jobs/(\d+)"', page)]
        more = re.search(r'href="(/jobs\?before=\d+)">older', page)
        url = more.group(1) if more else ""
    assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) == 7


def test_a_narrow_filter_reads_a_bounded_window_and_offers_to_look_further(
    engine: Engine, clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session(engine) as s:
        q = JobQueue(s)
        rare = q.enqueue(noop, "rare", queue="rare").id
        q.enqueue_many(noop, [[i] for i in range(10)])
        s.commit()
    monkeypatch.setattr(job_queries, "LIST_WINDOW", 4)
    client = Client(create_app(engine))
    page = body(client.get("/jobs?queue=rare"))
    assert f'href="/jobs/{rare}"' not in page  # beyond the first window
    hops = 0
    while f'href="/jobs/{rare}"' not in page:
        more = re.search(r'href="(/jobs\?[^"]*before=\d+)">search older ids', page)
        assert more, page
        page = body(client.get(more.group(1).replace("&amp;", "&")))
        hops += 1
    assert hops == 2  # ids 8-11, then 4-7, then 1-3


def test_job_page_shows_fields_and_the_whole_tree(client: Client, seeded: Seeded) -> None:
    page = body(client.get(f"/jobs/{seeded.labels[0]}"))  # a grandchild shows the whole tree
    tree = page.split('data-fragment="tree"', 1)[1]
    for job_id in (seeded.order, seeded.pack, *seeded.labels, seeded.manual):
        assert f'href="/jobs/{job_id}">#{job_id}</a>' in tree
    assert f'awaits <a href="/jobs/{seeded.manual}">#{seeded.manual}</a> manual step' in tree
    assert "label-7-0.pdf" in tree
    assert "indent-2 current" in tree  # the grandchild, highlighted
    failed = body(client.get(f"/jobs/{seeded.failed}"))
    assert "ConnectionError: could not reach the mail server" in failed
    assert "in flaky" in failed  # the traceback
    assert "1 failed of 1" in failed


def test_manual_token_is_shown_only_to_who_may_act(engine: Engine, seeded: Seeded) -> None:
    mounted = body(Client(create_app(engine)).get(f"/jobs/{seeded.order}"))
    assert seeded.token in mounted and 'action="/resolve"' in mounted
    for app in (create_app(engine, read_only=True), create_app(engine, token=TOKEN)):
        page = body(Client(app).get(f"/jobs/{seeded.order}"))
        assert seeded.token not in page and 'action="/resolve"' not in page


def test_every_value_is_escaped(client: Client, seeded: Seeded) -> None:
    for path in (f"/jobs/{seeded.xss}", "/jobs?status=failed"):
        page = body(client.get(path))
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
        assert "<script>window" not in page and "<img src=x" not in page
    assert XSS  # the payload is the one the browser test runs too


def test_unknown_job_and_asset_are_404(client: Client, seeded: Seeded) -> None:
    assert client.get("/jobs/999999").status_code == 404
    assert client.get("/static/secrets.txt").status_code == 404
    assert client.get("/jobs/99999999999999999999").status_code == 404


def test_responses_carry_a_strict_content_security_policy(client: Client, seeded: Seeded) -> None:
    response = client.get("/")
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert "'unsafe-inline'" not in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    css = client.get("/static/dashboard.css")
    assert css.status_code == 200 and css.mimetype == "text/css"
    assert client.get("/static/dashboard.css", headers={"If-None-Match": css.headers["ETag"]}).status_code == 304


def test_live_fragments_answer_304_until_something_changes(client: Client, seeded: Seeded, engine: Engine) -> None:
    first = client.get(f"/jobs/{seeded.failed}?live=1")
    assert first.status_code == 200
    assert 'data-fragment="job"' in body(first) and "<html" not in body(first)
    assert "X-Postjob-Now" in first.headers
    etag = first.headers["ETag"]
    assert client.get(f"/jobs/{seeded.failed}?live=1", headers={"If-None-Match": etag}).status_code == 304
    with Session(engine) as s:
        JobQueue(s).reset(seeded.failed)
        s.commit()
    again = client.get(f"/jobs/{seeded.failed}?live=1", headers={"If-None-Match": etag})
    assert again.status_code == 200 and "ready" in body(again)


# -- actions ---------------------------------------------------------------------------------


def test_reset_and_force(client: Client, seeded: Seeded, engine: Engine) -> None:
    response = post(client, f"/jobs/{seeded.failed}/reset")
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/jobs/{seeded.failed}?done=reset")
    assert status_of(engine, seeded.failed) == "ready"
    assert "Reset: the job" in body(client.get(response.headers["Location"]))
    assert post(client, f"/jobs/{seeded.failed}/force").status_code == 303
    # JobQueue's own validation applies: an ok job cannot be forced
    refused = post(client, f"/jobs/{seeded.labels[0]}/force")
    assert refused.status_code == 409 and "only ready, err or sleep" in body(refused)
    assert post(client, "/jobs/999999/reset").status_code == 404


def test_reset_of_a_job_whose_unique_key_another_holds_is_a_conflict(
    client: Client, engine: Engine, clean: None
) -> None:
    """Issue 24 item 6: 409 naming the holder, not 503 "database error"."""
    with Session(engine) as s:
        q = JobQueue(s)
        old = q.enqueue(noop, 1, unique_key="nightly").id
        end_by_hand(s, old)
        newer = q.enqueue(noop, 2, unique_key="nightly").id
        s.commit()
    refused = post(client, f"/jobs/{old}/reset")
    assert refused.status_code == 409, body(refused)
    assert f"held by unfinished job {newer}" in body(refused)
    assert status_of(engine, old) == "failed"


def test_cancel_a_tree_from_its_root(client: Client, seeded: Seeded, engine: Engine) -> None:
    page = body(client.get(f"/jobs/{seeded.order}"))
    assert f'action="/jobs/{seeded.order}/cancel"' in page  # the order sleeps: it can be cancelled
    response = post(client, f"/jobs/{seeded.order}/cancel")
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/jobs/{seeded.order}?done=cancelled")
    assert "Cancelled: the job" in body(client.get(response.headers["Location"]))
    # with its unfinished descendants (the manual step), through JobQueue.cancel
    assert (status_of(engine, seeded.order), status_of(engine, seeded.manual)) == ("cancelled", "cancelled")
    assert status_of(engine, seeded.labels[0]) == "ok"
    finished = f"/jobs/{seeded.labels[0]}"
    assert f'action="{finished}/cancel"' not in body(client.get(finished))
    refused = post(client, finished + "/cancel")
    assert refused.status_code == 409 and "only unfinished jobs can be cancelled" in body(refused)


def test_schedules_and_limits_page(client: Client, engine: Engine, clean: None) -> None:
    page = body(client.get("/schedules"))
    assert "None: a workflow gets a schedule" in page and "No queue has limits" in page
    with Session(engine) as s:
        q = JobQueue(s)
        q.set_queue_limits("mail", concurrency=1, rate=30, period=60)
        q.set_queue_limits("<b>bulk</b>", rate=5)
        last = q.enqueue(noop, "tick", queue="mail").id
        q.enqueue(noop, "more", queue="mail")
        s.execute(text(  # as workers register them (see test_schedules.py)
            "INSERT INTO postjob.schedules (name, cron, timezone, next_tick_at, last_run_at, "
            "last_job_id) VALUES ('reports.nightly', '0 3 * * *', 'Europe/Zurich', "
            "now() + interval '1 hour', now(), :last)"), {"last": last})
        s.execute(text("INSERT INTO postjob.schedules (name, every, skip_missed, next_tick_at) "
                       "VALUES ('web.ping', 90, true, now())"))
        s.commit()
        assert [j.id for j in q.checkout(queues=["mail"])] == [last]
        s.commit()  # the job is processing now, under a lease
    page = body(client.get("/schedules"))
    schedules = page[page.index('data-fragment="schedules"'):page.index('data-fragment="limits"')]
    assert "<code>0 3 * * *</code> Europe/Zurich" in schedules and "every 1m30s" in schedules
    assert f'href="/jobs/{last}">#{last}</a>' in schedules and "the latest runs once" in schedules
    assert "skipped" in schedules
    limits = page[page.index('data-fragment="limits"'):]
    mail = limits[limits.index(">mail<"):limits.index("</tr>", limits.index(">mail<"))]
    assert re.findall(r"<td[^>]*>([^<]*)<", mail)[:2] == ["1", "1"]  # processing 1 of at most 1
    assert 'class="num full"' in mail and "30" in mail and "1m" in mail
    assert "&lt;b&gt;bulk&lt;/b&gt;" in limits and "<b>bulk</b>" not in limits
    assert 'aria-current="page">Schedules' in page


def test_an_error_page_links_back_only_within_the_site(client: Client, seeded: Seeded) -> None:
    ok_job = f"/jobs/{seeded.labels[0]}"
    mine = post(client, ok_job + "/force", headers={"Referer": "http://localhost" + ok_job})
    assert mine.status_code == 409 and f'href="http://localhost{ok_job}">Back' in body(mine)
    for referer in ("https://evil.example/phish", "javascript:alert(1)"):
        page = body(post(client, ok_job + "/force", headers={"Referer": referer}))
        assert "evil.example" not in page and "javascript:" not in page


def test_actions_are_post_only(client: Client, seeded: Seeded) -> None:
    assert client.get(f"/jobs/{seeded.failed}/reset").status_code == 405
    assert client.get("/resolve").status_code == 405


def test_an_action_without_csrf_proof_is_refused(client: Client, seeded: Seeded, engine: Engine) -> None:
    csrf(client)
    assert client.post(f"/jobs/{seeded.failed}/reset", data={}).status_code == 403
    assert client.post(f"/jobs/{seeded.failed}/reset", data={"csrf": "x" * 43}).status_code == 403
    stranger = Client(create_app(engine))  # a cookie-less forger who copied a field value
    assert stranger.post(f"/jobs/{seeded.failed}/reset", data={"csrf": csrf(client)}).status_code == 403
    cross = post(client, f"/jobs/{seeded.failed}/reset", headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    site = post(client, f"/jobs/{seeded.failed}/reset", headers={"Sec-Fetch-Site": "cross-site"})
    assert site.status_code == 403
    assert status_of(engine, seeded.failed) == "failed"


def test_read_only_refuses_every_action(engine: Engine, seeded: Seeded) -> None:
    client = Client(create_app(engine, read_only=True))
    page = body(client.get(f"/jobs/{seeded.failed}"))
    assert "read-only" in page and "Reset</button>" not in page
    refused = post(client, f"/jobs/{seeded.failed}/reset")
    assert refused.status_code == 403 and "the dashboard is read-only" in body(refused)
    assert status_of(engine, seeded.failed) == "failed"
    assert "Cancel</button>" not in body(client.get(f"/jobs/{seeded.order}"))
    assert post(client, f"/jobs/{seeded.order}/cancel").status_code == 403
    assert status_of(engine, seeded.order) == "sleep"


def test_with_a_token_actions_need_a_login_or_the_bearer(engine: Engine, seeded: Seeded) -> None:
    client = Client(create_app(engine, token=TOKEN))
    refused = post(client, f"/jobs/{seeded.failed}/reset")
    assert refused.status_code == 403 and "log in" in body(refused)
    assert status_of(engine, seeded.failed) == "failed"
    assert post(client, "/login", {"token": "wrong token!"}).status_code == 403
    assert post(client, f"/jobs/{seeded.failed}/reset").status_code == 403
    assert post(client, "/login", {"token": TOKEN}).status_code == 303
    session = client.get_cookie("postjob_session")
    assert session is not None and TOKEN not in session.value  # an HMAC, not the secret
    assert post(client, f"/jobs/{seeded.failed}/reset").status_code == 303
    assert status_of(engine, seeded.failed) == "ready"
    post(client, "/logout")
    assert post(client, f"/jobs/{seeded.failed}/force").status_code == 403
    scripted = Client(create_app(engine, token=TOKEN))
    bearer = post(scripted, f"/jobs/{seeded.failed}/force", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 303


def test_a_script_with_the_bearer_alone_may_act(engine: Engine, seeded: Seeded) -> None:
    """Issue 24 item 11: ``Authorization: Bearer SECRET`` is enough for a script, as
    docs/dashboard.md says: no CSRF cookie fetched first, no form field."""
    script = Client(create_app(engine, token=TOKEN))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    done = script.post(f"/jobs/{seeded.failed}/reset", headers=bearer)
    assert done.status_code == 303, body(done)
    assert status_of(engine, seeded.failed) == "ready"
    resolved = script.post("/resolve", data={"token": seeded.token, "value": '"ann"'}, headers=bearer)
    assert resolved.status_code == 303, body(resolved)
    assert status_of(engine, seeded.manual) == "ok"
    assert script.get_cookie("postjob_csrf") is None  # it never had one
    # a wrong bearer is refused, and says so
    wrong = Client(create_app(engine, token=TOKEN)).post(
        f"/jobs/{seeded.failed}/force", headers={"Authorization": "Bearer not the secret"})
    assert wrong.status_code == 403 and "bearer token" in body(wrong)
    # a browser's cross-site request is refused even with the bearer
    cross = script.post(f"/jobs/{seeded.xss}/reset", headers={**bearer, "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403
    assert status_of(engine, seeded.xss) == "failed"


def test_a_logged_in_browser_still_needs_the_csrf_value(engine: Engine, seeded: Seeded) -> None:
    """The session cookie is sent by the browser whoever made the page: CSRF stays required."""
    client = Client(create_app(engine, token=TOKEN))
    assert post(client, "/login", {"token": TOKEN}).status_code == 303
    assert client.post(f"/jobs/{seeded.failed}/reset", data={}).status_code == 403
    assert status_of(engine, seeded.failed) == "failed"
    assert post(client, f"/jobs/{seeded.failed}/reset").status_code == 303


def test_a_login_session_expires_and_each_login_has_its_own(engine: Engine, seeded: Seeded) -> None:
    """Issue 24: the session cookie was a fixed HMAC of the token, the same for every login,
    valid for ever. Now each login gets its own, for 12 hours (the cookie's Max-Age, and the
    server's check of its signed time)."""
    app = create_app(engine, token=TOKEN)
    client = Client(app)
    response = post(client, "/login", {"token": TOKEN})
    assert response.status_code == 303
    [set_cookie] = [h for h in response.headers.getlist("Set-Cookie") if h.startswith("postjob_session=")]
    assert "Max-Age=43200" in set_cookie and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    cookie = client.get_cookie("postjob_session")
    assert cookie is not None
    other = Client(app)
    assert post(other, "/login", {"token": TOKEN}).status_code == 303
    assert other.get_cookie("postjob_session").value != cookie.value  # type: ignore[union-attr]
    # tampering with the signed time is refused
    issued, rest = cookie.value.split(".", 1)
    forged = Client(app)
    forged.set_cookie("postjob_session", f"{int(issued) + 3600}.{rest}")
    assert post(forged, f"/jobs/{seeded.failed}/force").status_code == 403
    # twelve hours later the server refuses the cookie (whatever a client keeps)
    assert "Log out" in body(client.get("/"))
    app.guard = dataclasses.replace(app.guard, clock=lambda: time.time() + 12 * 3600 + 1)
    refused = post(client, f"/jobs/{seeded.failed}/reset")
    assert refused.status_code == 403 and "log in" in body(refused)
    assert status_of(engine, seeded.failed) == "failed"
    app.guard = dataclasses.replace(app.guard, clock=time.time)
    assert post(client, f"/jobs/{seeded.failed}/reset").status_code == 303


def test_resolve_with_a_value_wakes_the_parent(client: Client, seeded: Seeded, engine: Engine) -> None:
    form = {"token": seeded.token, "value": '"ann"', "outcome": "value", "back": str(seeded.order)}
    response = post(client, "/resolve", form)
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/jobs/{seeded.order}?done=resolved")
    assert status_of(engine, seeded.manual) == "ok"
    assert status_of(engine, seeded.order) == "ready"
    again = post(client, "/resolve", form)
    assert again.status_code == 409 and "already ok" in body(again)


def test_resolve_with_an_error_fails_the_step(client: Client, seeded: Seeded, engine: Engine) -> None:
    form = {"token": seeded.token, "error": "not approved", "outcome": "error"}
    assert post(client, "/resolve", form).status_code == 303
    assert status_of(engine, seeded.manual) == "failed"


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"value": "not json", "outcome": "value"}, "not JSON"),
        ({"value": "", "outcome": "value"}, "give the step"),
        ({"error": "", "outcome": "error"}, "give the error"),
        ({"error": "not\x00approved", "outcome": "error"}, "NUL"),  # %00 in the form
        ({"token": "", "value": "1"}, "token is missing"),
        ({"token": "not-a-uuid", "value": "1"}, "not a token"),
    ],
)
def test_resolve_rejects_bad_input(
    client: Client, seeded: Seeded, engine: Engine, form: dict[str, str], message: str
) -> None:
    response = post(client, "/resolve", {"token": seeded.token, **form})
    assert response.status_code == 400 and message in body(response)
    assert status_of(engine, seeded.manual) == "ready"


def test_create_app_rejects_bad_settings(engine: Engine) -> None:
    with pytest.raises(InvalidArgument):
        create_app(engine, token="short")
    with pytest.raises(InvalidArgument):
        create_app(engine, refresh=-1)
    with pytest.raises(InvalidArgument, match="session_max_age"):
        create_app(engine, token=TOKEN, session_max_age=0)


def test_a_mounted_app_builds_links_under_its_path(engine: Engine, seeded: Seeded) -> None:
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    host = DispatcherMiddleware(lambda e, s: [], {"/ops/jobs": create_app(engine)})
    client = Client(host)
    page = body(client.get(f"/ops/jobs/jobs/{seeded.failed}"))
    assert 'href="/ops/jobs/static/dashboard.css' in page
    assert f'action="/ops/jobs/jobs/{seeded.failed}/reset"' in page
    response = client.post(f"/ops/jobs/jobs/{seeded.failed}/reset",
                           data={"csrf": client.get_cookie("postjob_csrf", path="/ops/jobs/").value})  # type: ignore[union-attr]
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/ops/jobs/jobs/{seeded.failed}?done=reset")



def test_the_overview_shows_the_hot_tables_and_warns_that_autovacuum_is_off(
        client: Client, seeded: Seeded, engine: Engine) -> None:
    """Where the server runs without autovacuum (the local test server; the embedded one has
    it on), the overview says so, with the fix; where it runs, it does not (issue 34)."""
    with engine.connect() as conn:
        off = conn.execute(text("SHOW autovacuum")).scalar() == "off"
    page = body(client.get("/"))
    tables = page[page.index('data-fragment="tables"'):]
    warned = "autovacuum is off" in tables and "ALTER SYSTEM SET autovacuum = on" in tables
    assert warned == off, tables
    for name in (*_hot_tables.HOT_TABLES, "postjob.postjobs_from_0"):  # the record's ranges
        assert f">{name}<" in tables, name


def test_the_history_page_shows_the_ranges_and_the_retention(client: Client, engine: Engine,
                                                             clean: None) -> None:
    page = body(client.get("/history"))
    assert "Finished jobs are kept for ever" in page and "postjobs_from_0" in page
    with Session(engine) as s:
        q = JobQueue(s)
        q.set_history(keep=timedelta(days=30))
        root = q.enqueue(noop, "pinning").id  # unfinished: its range is pinned
        s.commit()
    page = body(client.get("/history"))
    assert "<strong>30d00h</strong> after they settled" in page
    assert f'href="/jobs/{root}">job tree {root}</a>' in page
    with Session(engine) as s:
        JobQueue(s).set_history(keep=None)
        s.commit()
