"""The postjob dashboard mounted in a Litestar app.

Litestar hands a mounted ASGI app the path below the mount (``/jobs/7``, not
``/admin/jobs/jobs/7``) and leaves ``root_path`` alone, so the dashboard cannot see where it
is mounted: ``as_asgi(..., mount_path=...)`` tells it, and every link, form and asset of the
dashboard then starts with that path. HTTP Basic (``examples/admin_guard.py``) stands in for
the app's own authentication.

    ADMIN_PASSWORD=... DATABASE_URL=... uvicorn --factory examples.litestar_dashboard:create_app
"""

from __future__ import annotations

import os

from litestar import Litestar, asgi, get
from sqlalchemy import Engine, create_engine

import postjob_sa.web
from examples.admin_guard import basic_auth


@get("/")
async def home() -> str:
    return "the app's own pages"


def create_app(engine: Engine | None = None) -> Litestar:
    engine = engine or create_engine(os.environ["DATABASE_URL"])
    # docs: begin mount
    # Litestar strips the mount from the path and sets no root_path: say where it is mounted.
    dashboard = postjob_sa.web.create_app(engine)
    guarded = basic_auth(dashboard, os.environ.get("ADMIN_PASSWORD"))
    mounted = asgi("/admin/jobs", is_mount=True, copy_scope=True)(
        postjob_sa.web.as_asgi(guarded, mount_path="/admin/jobs"))
    app = Litestar(route_handlers=[home, mounted])
    # docs: end mount
    return app
