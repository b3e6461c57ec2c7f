"""postjob_sa.web: the dashboard, a WSGI application.

``create_app(engine)`` builds it; ``postjob web`` serves it on its own, and a host mounts it
under a path of its own, behind its own authentication: in Flask with werkzeug's
``DispatcherMiddleware``, in FastAPI with ``app.mount(path, as_asgi(dashboard))``. Needs the
``web`` extra (``pip install 'postjob_sa[web]'``).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import werkzeug  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"the dashboard needs the web extra: pip install 'postjob_sa[web]' ({exc})"
    ) from exc

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from postjob_sa._db import check_driver, check_url
from postjob_sa._sync_url import sync_url
from postjob_sa.errors import InvalidArgument

from .app import Dashboard
from .asgi import as_asgi
from .auth import SESSION_MAX_AGE, Guard
from .redaction import checked
from .views import Settings

__all__ = ["Dashboard", "as_asgi", "create_app"]


def create_app(
    bind: Engine | str,
    *,
    token: str | None = None,
    read_only: bool = False,
    refresh: float = 2.0,
    stuck_after: float = 60.0,
    session_max_age: float = SESSION_MAX_AGE,
    show_args: bool = True,
    redact: Callable[[Any], Any] | None = None,
) -> Dashboard:
    """The dashboard on ``bind`` (an Engine, or a database URL), as a WSGI application.

    ``read_only`` hides and refuses every action. With a ``token``, actions need it (the
    browser logs in once at ``/login``; scripts send ``Authorization: Bearer <token>``);
    without one, whoever reaches the app may act, so mount it behind your own
    authentication. ``refresh`` is how often pages update themselves, in seconds (0: never);
    ``stuck_after`` is how long a due job may wait before the overview lists it among the
    jobs no running worker runs; ``session_max_age`` how long a login at ``/login`` lasts, in
    seconds (12 hours).

    Job args and results are stored in clear and shown in clear. ``show_args=False`` shows
    none of them (args, results, durable steps' results, manual steps' labels); ``redact``
    is called with each such value and returns what to show (a redact that raises hides it).
    """
    if token is not None and (not isinstance(token, str) or len(token) < 8):
        raise InvalidArgument("the dashboard's token must be a string of at least 8 characters")
    for name, value in (("refresh", refresh), ("stuck_after", stuck_after)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise InvalidArgument(f"{name} must be a number of seconds, not {value!r}")
    if (isinstance(session_max_age, bool) or not isinstance(session_max_age, (int, float))
            or not 60 <= session_max_age <= 366 * 86400):
        raise InvalidArgument("session_max_age must be a number of seconds from 60 to a year, "
                              f"not {session_max_age!r}")
    try:
        redaction = checked(show_args, redact)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if isinstance(bind, str):
        try:
            url = sync_url(make_url(bind))  # an async app's URL: the same database, psycopg 3
        except (ArgumentError, ValueError):
            raise InvalidArgument("not a database URL (the password is not shown)") from None
        check_url(url)
        engine = create_engine(url, connect_args={"application_name": "postjob web"})
    else:
        engine = bind
    check_driver(engine)
    return Dashboard(
        engine, Guard(token=token, read_only=bool(read_only),
                      session_max_age=float(session_max_age)),
        Settings(refresh=float(refresh), stuck_after=float(stuck_after), redaction=redaction),
    )
