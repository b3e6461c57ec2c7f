"""docs/dashboard.md's single-page app: its API takes a JWT bearer, a browser's navigation to
the dashboard carries none, so the SPA trades the bearer for a cookie of the dashboard's path
(examples/spa_dashboard.py), which the guard in front of the dashboard checks."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from examples import spa_dashboard

SECRET = b"the app's own secret, never the JWT's"


def _admin_of(jwt: str) -> str | None:
    """Stand-in for the app's JWT check."""
    return {"jwt-of-ada": "ada"}.get(jwt)


def test_a_navigation_without_the_cookie_is_refused_and_the_bearer_opens_a_session(
    engine: Engine
) -> None:
    app = spa_dashboard.create_app(engine, SECRET, _admin_of)
    with TestClient(app, base_url="https://shop.example") as browser:
        assert browser.get("/admin/jobs/").status_code == 401  # a navigation: no bearer
        # the bearer alone does not open the dashboard either: pages are navigated to
        assert browser.get("/admin/jobs/", headers={
            "Authorization": "Bearer jwt-of-ada"}).status_code == 401
        assert browser.post("/admin/dashboard-session").status_code in (401, 403)
        assert browser.post("/admin/dashboard-session", headers={
            "Authorization": "Bearer someone-else"}).status_code == 403

        opened = browser.post("/admin/dashboard-session",
                              headers={"Authorization": "Bearer jwt-of-ada"})
        assert opened.status_code == 204
        cookie = opened.headers["set-cookie"]
        for attribute in ("Path=/admin/jobs", "HttpOnly", "Secure", "SameSite=strict",
                          f"Max-Age={spa_dashboard.LIFETIME}"):
            assert attribute in cookie, cookie
        page = browser.get("/admin/jobs/")
        assert page.status_code == 200 and "Overview" in page.text
        assert browser.get("/signups").status_code == 404  # the cookie is the dashboard's


def test_the_cookie_is_the_apps_to_sign_and_it_expires() -> None:
    now = time.time()
    value = spa_dashboard.mint(SECRET, "ada", now)
    assert spa_dashboard.holder(SECRET, value, now) == "ada"
    assert spa_dashboard.holder(SECRET, value, now + spa_dashboard.LIFETIME + 1) is None
    assert spa_dashboard.holder(b"another secret", value, now) is None
    forged = value.replace("ada.", "eve.", 1)
    assert spa_dashboard.holder(SECRET, forged, now) is None
    assert spa_dashboard.holder(SECRET, "nonsense", now) is None
