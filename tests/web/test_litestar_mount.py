"""The dashboard mounted in a real Litestar app (examples/litestar_dashboard.py), through
Litestar's TestClient, which runs the app's ASGI stack: Litestar strips the mount from the
path without setting root_path, so only ``as_asgi(mount_path=...)`` can tell the dashboard
where it is. Every link, asset and form of every page must start with the mount and resolve."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from html import unescape
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine

from tests.web_data import Seeded, seed

litestar_testing = pytest.importorskip("litestar.testing")

MOUNT = "/admin/jobs"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()}
_URL = re.compile(r'\b(href|src|action)="([^"]*)"')


@pytest.fixture
def browser(engine: Engine, clean: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    from examples import litestar_dashboard

    monkeypatch.setenv("ADMIN_PASSWORD", "s3cret")
    app = litestar_dashboard.create_app(engine)
    with litestar_testing.TestClient(app) as client:
        client.headers.update(ADMIN)
        yield client


def urls(page: str) -> list[tuple[str, str]]:
    return [(kind, unescape(url)) for kind, url in _URL.findall(page)
            if not url.startswith("data:")]


def test_every_link_form_and_asset_starts_with_the_mount_and_resolves(
    browser: object, engine: Engine
) -> None:
    from litestar.testing import TestClient

    assert isinstance(browser, TestClient)
    seeded: Seeded = seed(engine)
    assert browser.get(MOUNT + "/", headers={"Authorization": ""}).status_code == 401
    start = [MOUNT + "/", f"{MOUNT}/jobs/{seeded.order}", f"{MOUNT}/jobs/{seeded.failed}",
             f"{MOUNT}/schedules", f"{MOUNT}/history", f"{MOUNT}/jobs?status=failed"]
    seen: set[str] = set()
    actions: set[str] = set()
    todo = list(start)
    while todo and len(seen) < 60:
        url = todo.pop(0)
        if url in seen:
            continue
        seen.add(url)
        response = browser.get(url, follow_redirects=False)
        assert response.status_code == 200, (url, response.status_code, response.text[:300])
        if not response.headers["content-type"].startswith("text/html"):
            continue
        found = urls(response.text)
        assert found, url
        for kind, link in found:
            assert link.startswith(MOUNT + "/"), (url, kind, link)
            assert not urlsplit(link).netloc, link
            if kind == "action":
                actions.add(link)
            elif link not in seen:
                todo.append(link)
    for asset in ("dashboard.css", "dashboard.js"):
        assert any(f"{MOUNT}/static/{asset}" in u for u in seen), asset
    assert f"{MOUNT}/jobs/{seeded.failed}/reset" in actions

    # a form's action goes to the dashboard too, and its answer stays under the mount
    csrf = browser.cookies.get("postjob_csrf")
    assert csrf
    response = browser.post(f"{MOUNT}/jobs/{seeded.failed}/reset", data={"csrf": csrf},
                            headers={"Origin": str(browser.base_url).rstrip("/")},
                            follow_redirects=False)
    assert response.status_code == 303, response.text[:300]
    assert urlsplit(response.headers["location"]).path == f"{MOUNT}/jobs/{seeded.failed}"
    assert browser.get(response.headers["location"]).status_code == 200
    assert browser.get("/").text == "the app's own pages"


def test_a_mount_path_the_host_already_names_is_not_added_twice(engine: Engine, clean: None) -> None:
    """Starlette puts the mount in root_path: a mount_path given there too changes nothing."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from postjob_sa.web import as_asgi, create_app

    app = FastAPI()
    app.mount(MOUNT, as_asgi(create_app(engine), mount_path=MOUNT + "/"))
    with TestClient(app) as client:
        page = client.get(MOUNT + "/jobs").text
    assert f'href="{MOUNT}/static/dashboard.css' in page and MOUNT + MOUNT not in page


@pytest.mark.parametrize("bad", ["admin/jobs", "/admin/jobs?x=1", "/a//b", "/a b", 7])
def test_a_mount_path_that_is_not_a_path_is_refused(bad: object) -> None:
    from postjob_sa import InvalidArgument
    from postjob_sa.web import as_asgi

    with pytest.raises(InvalidArgument, match="mount_path"):
        as_asgi(lambda e, s: [], mount_path=bad)  # type: ignore[arg-type]
