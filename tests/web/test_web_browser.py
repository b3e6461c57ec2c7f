"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright.

Select these with ``-m browser``; they run in ``make test``. Without /usr/bin/chromium they
are skipped on a developer's machine and fail in CI (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from postjob_sa.web import create_app
from postjob_sa.web.server import server
from tests.conftest import end_by_hand
from tests.web.test_web import status_of
from tests.web_data import Seeded, noop, seed

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]
TOKEN = "browser test token"


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


class Served:
    def __init__(self, app: Any):
        self.httpd = server(app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def site(engine: Engine) -> Iterator[Served]:
    """The dashboard as a host mounts it: no token of its own."""
    served = Served(create_app(engine, refresh=0.3))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def locked_site(engine: Engine) -> Iterator[Served]:
    """The dashboard as ``postjob web --token`` serves it."""
    served = Served(create_app(engine, token=TOKEN, refresh=0.3))
    yield served
    served.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    problems: list[str] = []
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(str(e)))
    tab.problems = problems
    yield tab
    context.close()


@pytest.fixture
def seeded(engine: Engine, clean: None) -> Seeded:
    return seed(engine)


def drain_soon(engine: Engine, delay: float = 0.5) -> threading.Thread:
    """A worker in the background: runs what is due after ``delay`` seconds."""

    def work() -> None:
        threading.Event().wait(delay)
        with Session(engine) as s:
            JobQueue(s, fast_mode=True).drain()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_each_page_loads_without_errors(page: Any, site: Served, seeded: Seeded) -> None:
    for path, heading in [("/", "Overview"), ("/jobs", "Jobs"), (f"/jobs/{seeded.order}", f"Job #{seeded.order}"),
                          ("/schedules", "Schedules and limits")]:
        page.goto(site.url + path)
        assert heading in page.locator("h1").first.inner_text()
    page.wait_for_selector("#live-state.live")  # the script ran and a refresh came back
    assert page.problems == []  # no script error, no blocked resource, no CSP violation


def test_follow_a_tree_from_the_overview_to_a_grandchild(page: Any, site: Served, seeded: Seeded) -> None:
    page.goto(site.url + "/")
    page.get_by_role("link", name=f"#{seeded.manual}").click()  # the manual step: its tree
    page.wait_for_url(f"**/jobs/{seeded.order}")
    tree = page.locator('[data-fragment="tree"]')
    assert tree.locator(".node").count() == 5
    assert f"awaits #{seeded.manual} manual step" in tree.inner_text()
    tree.get_by_role("link", name=f"#{seeded.pack}").click()
    page.wait_for_url(f"**/jobs/{seeded.pack}")
    page.locator('[data-fragment="tree"]').get_by_role("link", name=f"#{seeded.labels[1]}").click()
    page.wait_for_url(f"**/jobs/{seeded.labels[1]}")
    current = page.locator(".node.current")
    assert f"#{seeded.labels[1]}" in current.inner_text() and "web.label" in current.inner_text()
    assert "label-7-1.pdf" in current.inner_text()


def test_resolve_a_manual_step_and_see_the_parent_wake(page: Any, site: Served, seeded: Seeded, engine: Engine) -> None:
    page.goto(site.url + f"/jobs/{seeded.order}")
    form = page.locator("form.resolve")
    form.get_by_label(f"value of manual step {seeded.manual} (JSON)").fill('"ann"')
    form.get_by_role("button", name="Resolve").click()
    page.wait_for_url("**done=resolved")
    assert "Resolved: the manual step is done" in page.locator(".notice").inner_text()
    worker = drain_soon(engine)
    # the page updates itself: the root finishes with the approver's name
    page.locator('[data-fragment="job"] .badge.st-ok').wait_for()
    worker.join()
    assert '"approved_by": "ann"' in page.locator('[data-fragment="job"]').inner_text()


def test_failing_a_manual_step_with_a_nul_is_a_clear_400(
    page: Any, site: Served, seeded: Seeded, engine: Engine
) -> None:
    """Issue 24 item 7: the Fail form's message is checked like any text (it was 503)."""
    page.goto(site.url + f"/jobs/{seeded.order}")
    form = page.locator("form.resolve")
    field = form.get_by_label(f"error message for manual step {seeded.manual}")
    field.evaluate("(input) => { input.value = 'not\\u0000approved'; }")
    with page.expect_response(lambda r: r.url.endswith("/resolve")) as answered:
        form.get_by_role("button", name="Fail").click()
    assert answered.value.status == 400
    assert "must not contain NUL characters" in page.locator(".problem").inner_text()
    assert status_of(engine, seeded.manual) == "ready"


def test_reset_a_failed_job(page: Any, site: Served, seeded: Seeded, engine: Engine) -> None:
    page.goto(site.url + f"/jobs/{seeded.failed}")
    assert "could not reach the mail server" in page.inner_text("body")
    page.get_by_role("button", name="Reset").click()
    page.wait_for_url("**done=reset")
    assert page.locator('[data-fragment="job"] .badge').first.inner_text() == "ready"
    assert status_of(engine, seeded.failed) == "ready"


def test_reset_of_a_job_whose_unique_key_another_holds_says_which(
    page: Any, site: Served, engine: Engine, clean: None
) -> None:
    """Issue 24 item 6: a 409 page naming the holder (it was 503 "database error")."""
    with Session(engine) as s:
        q = JobQueue(s)
        old = q.enqueue(noop, 1, unique_key="nightly").id
        end_by_hand(s, old)
        newer = q.enqueue(noop, 2, unique_key="nightly").id
        s.commit()
    page.goto(site.url + f"/jobs/{old}")
    with page.expect_response(lambda r: r.url.endswith(f"/jobs/{old}/reset")) as answered:
        page.get_by_role("button", name="Reset").click()
    assert answered.value.status == 409
    assert f"held by unfinished job {newer}" in page.locator(".problem").inner_text()
    assert status_of(engine, old) == "failed"


def test_cancel_a_sleeping_tree(page: Any, site: Served, seeded: Seeded, engine: Engine) -> None:
    page.goto(site.url + f"/jobs/{seeded.order}")
    page.locator('[data-fragment="job"]').get_by_role("button", name="Cancel").click()
    page.wait_for_url("**done=cancelled")
    assert page.locator('[data-fragment="job"] .badge').first.inner_text() == "cancelled"
    tree = page.locator('[data-fragment="tree"]')
    assert tree.locator(".badge.st-cancelled").count() == 2  # the order and its manual step
    assert status_of(engine, seeded.manual) == "cancelled"


def test_an_action_without_the_token_is_refused(page: Any, locked_site: Served, seeded: Seeded, engine: Engine) -> None:
    page.goto(locked_site.url + f"/jobs/{seeded.failed}")
    assert page.get_by_role("button", name="Reset").count() == 0
    # a hand-made form with a valid CSRF value, but no login
    page.goto(locked_site.url + "/login")
    page.evaluate(
        """(action) => {
             const form = document.createElement("form");
             form.method = "post"; form.action = action;
             form.appendChild(document.querySelector("input[name=csrf]").cloneNode());
             document.body.appendChild(form); form.submit();
           }""",
        f"/jobs/{seeded.failed}/reset",
    )
    page.wait_for_url(f"**/jobs/{seeded.failed}/reset")
    assert "log in first" in page.inner_text("body")
    assert status_of(engine, seeded.failed) == "failed"
    # with the token, the same action goes through
    page.goto(locked_site.url + "/login")
    page.get_by_label("token").fill(TOKEN)
    page.get_by_role("button", name="Log in").click()
    page.goto(locked_site.url + f"/jobs/{seeded.failed}")
    page.get_by_role("button", name="Reset").click()
    page.wait_for_url("**done=reset")
    assert status_of(engine, seeded.failed) == "ready"


def test_a_login_lasts_twelve_hours_in_the_browser(page: Any, locked_site: Served, seeded: Seeded) -> None:
    """The browser keeps the session cookie for its Max-Age, not for ever (issue 24)."""
    page.goto(locked_site.url + "/login")
    page.get_by_label("token").fill(TOKEN)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(locked_site.url + "/")
    [session] = [c for c in page.context.cookies() if c["name"] == "postjob_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert abs(session["expires"] - (time.time() + 12 * 3600)) < 120
    assert page.get_by_role("button", name="Log out").count() == 1


def test_an_xss_payload_renders_inert(page: Any, site: Served, seeded: Seeded) -> None:
    for path in (f"/jobs/{seeded.xss}", "/jobs?status=failed", "/"):
        page.goto(site.url + path)
        page.wait_for_timeout(400)  # a live refresh too
        assert page.evaluate("window.__pwned") is None
    page.goto(site.url + f"/jobs/{seeded.xss}")
    assert "<script>window.__pwned = 1</script>" in page.locator("pre").first.inner_text()
    assert page.locator("body img").count() == 0


def test_the_page_updates_when_a_job_finishes_in_the_background(
    page: Any, site: Served, engine: Engine, clean: None
) -> None:
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue(noop, {"n": 1}).id
        s.commit()
    page.goto(site.url + f"/jobs/{job_id}")
    assert page.locator('[data-fragment="job"] .badge').first.inner_text() == "ready"
    page.evaluate("window.__still_here = true")
    worker = drain_soon(engine)
    page.locator('[data-fragment="job"] .badge.st-ok').wait_for()
    worker.join()
    assert page.evaluate("window.__still_here") is True  # swapped in place, no reload
    assert '"n": 1' in page.locator('[data-fragment="job"]').inner_text()


def test_a_form_being_filled_in_is_not_swapped_away(page: Any, site: Served, seeded: Seeded, engine: Engine) -> None:
    page.goto(site.url + f"/jobs/{seeded.order}")
    field = page.get_by_label(f"value of manual step {seeded.manual} (JSON)")
    field.fill('{"by": "half typed')
    page.locator("h1").click()  # focus elsewhere: the typed value alone keeps the region
    with engine.begin() as conn:  # the tree changes meanwhile
        conn.execute(text("UPDATE postjob.postjobs SET workflow_status = 'waiting for sign-off' "
                          "WHERE id = :i"), {"i": seeded.order})
    page.get_by_text("waiting for sign-off").first.wait_for()  # the job's fields updated ...
    assert "waiting for sign-off" not in page.locator('[data-fragment="tree"]').inner_text()
    assert field.input_value() == '{"by": "half typed'  # ... the tree with the form did not
