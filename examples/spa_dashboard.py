"""The postjob dashboard in a single-page app whose API takes a JWT as a bearer token.

The SPA sends ``Authorization: Bearer <jwt>`` with each of its fetch() calls, but a browser
that navigates to the dashboard (a link, a new tab, the dashboard's own links and forms) sends
no such header: a guard that looks for the bearer refuses the dashboard's every page. So the
SPA trades its bearer for a cookie first: it POSTs to ``/admin/dashboard-session`` with the
bearer (checked as every API call is), the app answers with a short-lived cookie, signed by the
app, HttpOnly, Secure, SameSite=Strict and sent only under the dashboard's path, and the SPA
then navigates there. The guard in front of the dashboard checks that cookie.

    DASHBOARD_SECRET=... uvicorn --factory examples.spa_dashboard:create_app
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

import postjob_sa.web

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# docs: begin cookie
MOUNT = "/admin/jobs"
COOKIE = "dashboard_session"
LIFETIME = 15 * 60  # seconds: the SPA asks again when it opens the dashboard later


def mint(secret: bytes, user: str, now: float) -> str:
    """``user.expiry.signature``: who opened the dashboard, until when, signed by the app."""
    body = f"{user}.{int(now) + LIFETIME}"
    return body + "." + hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()


def holder(secret: bytes, value: str, now: float) -> str | None:
    """The user a cookie value names, if the app signed it and it has not expired."""
    body, _, signature = value.rpartition(".")
    user, _, until = body.rpartition(".")
    expected = hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
    if not user or not until.isdigit() or not hmac.compare_digest(signature, expected):
        return None
    return user if now < int(until) else None


def cookie_guard(app: WSGIApp, secret: bytes) -> WSGIApp:
    """The dashboard, for requests that bring a valid session cookie; 401 for the others."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            morsel = SimpleCookie(environ.get("HTTP_COOKIE", "")).get(COOKIE)
        except CookieError:
            morsel = None
        if morsel is not None and holder(secret, morsel.value, time.time()) is not None:
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain")])
        return [b"open the dashboard from the app, signed in as an administrator\n"]

    return guarded
# docs: end cookie


def admin(request: Request,
          credentials: Annotated[HTTPAuthorizationCredentials, Depends(HTTPBearer())]) -> str:
    """The administrator the request's bearer names (the app's own JWT check), or 403."""
    user = request.app.state.admin_of(credentials.credentials)
    if user is None:
        raise HTTPException(403, "administrators only")
    return str(user)


Admin = Annotated[str, Depends(admin)]


def create_app(engine: Engine | str, secret: bytes,
               admin_of: Callable[[str], str | None]) -> FastAPI:
    """The app: ``admin_of(jwt)`` is its own bearer check (decode and verify the JWT, look
    the user up), giving the administrator's name, or None."""
    app = FastAPI()
    app.state.admin_of = admin_of

    # docs: begin session
    @app.post("/admin/dashboard-session", status_code=204)
    def open_dashboard(user: Admin, response: Response) -> None:
        """Trade the bearer for the dashboard's cookie; the SPA then navigates to MOUNT."""
        response.set_cookie(COOKIE, mint(secret, user, time.time()), max_age=LIFETIME,
                            path=MOUNT, httponly=True, secure=True, samesite="strict")

    dashboard = postjob_sa.web.create_app(engine)
    app.mount(MOUNT, postjob_sa.web.as_asgi(cookie_guard(dashboard, secret)))
    # docs: end session
    return app
