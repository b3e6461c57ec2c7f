"""The dashboard as a WSGI application: routing, rendering, errors and response headers.

Reads run in a read-only transaction (``queries.reading``); actions in a Session of their own
through ``JobQueue`` (``actions``); who may act is ``auth.Guard``'s business. A page is a
layout plus named fragments: ``?live=1`` answers with the fragments alone (and 304 when
none changed), which is what the page script polls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import Map, MapAdapter, Rule
from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from postjob_sa.errors import InvalidArgument, InvalidJobState, JobNotFound

from . import actions, auth, render, views
from . import queries as q
from .assets import Assets

log = logging.getLogger("postjob_sa.web")

MAX_ID = 2**63 - 1
SECURITY_HEADERS = {
    # no inline script or style anywhere: an injected tag would not run even if escaping failed
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}
_ERROR_STATUS = {InvalidArgument: 400, JobNotFound: 404, InvalidJobState: 409}

URLS = Map(
    [
        Rule("/", endpoint="overview"),
        Rule("/jobs", endpoint="jobs"),
        Rule(f"/jobs/<int(min=1, max={MAX_ID}):job_id>", endpoint="job"),
        Rule(f"/jobs/<int(min=1, max={MAX_ID}):job_id>/reset", endpoint="reset", methods=["POST"]),
        Rule(f"/jobs/<int(min=1, max={MAX_ID}):job_id>/force", endpoint="force", methods=["POST"]),
        Rule(f"/jobs/<int(min=1, max={MAX_ID}):job_id>/cancel", endpoint="cancel", methods=["POST"]),
        Rule("/schedules", endpoint="schedules"),
        Rule("/history", endpoint="history"),
        Rule("/resolve", endpoint="resolve", methods=["POST"]),
        Rule("/login", endpoint="login", methods=["GET", "POST"]),
        Rule("/logout", endpoint="logout", methods=["POST"]),
        Rule("/static/<name>", endpoint="static"),
    ],
    strict_slashes=False,
)


def _same_site(request: Request, url: str | None) -> str | None:
    """A URL to link back to, if it is on this site (a Referer could say anything)."""
    return url if url and url.startswith(request.host_url) else None


class Dashboard:
    """The dashboard's WSGI callable. Build it with :func:`postjob_sa.web.create_app`."""

    def __init__(self, engine: Engine, guard: auth.Guard, settings: views.Settings):
        self.engine = engine
        self.guard = guard
        self.settings = settings
        self.templates = render.environment()
        self.assets = Assets()
        self.throughput = views.Reused()  # the overview's last hour, read now and then

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = Request(environ)
        response = self.handle(request)
        return response(environ, start_response)

    # -- dispatch ------------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        urls = URLS.bind_to_environ(request.environ)
        try:
            endpoint, values = urls.match()
            response: Response = getattr(self, "on_" + endpoint)(request, urls, **values)
        except HTTPException as exc:
            response = self.error_page(request, urls, exc.code or 500, exc.description or exc.name)
        except (InvalidArgument, JobNotFound, InvalidJobState) as exc:
            status = next(s for kind, s in _ERROR_STATUS.items() if isinstance(exc, kind))
            response = self.error_page(request, urls, status, str(exc))
        except DBAPIError as exc:
            log.exception("database error")
            first = str(exc.orig or exc).strip().splitlines()[:1]
            response = self.error_page(request, urls, 503, "database error: " + " ".join(first))
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        auth.set_csrf_cookie(request, response)
        return response

    def common(self, request: Request, urls: MapAdapter) -> dict[str, Any]:
        """What every template may use."""

        def url(endpoint: str, params: Iterable[tuple[str, str]] = (), **values: Any) -> str:
            return urls.build(endpoint, MultiDict([*values.items(), *params]))

        return {
            "url": url,
            "static": lambda name: url("static", name=name, v=self.assets.version(name)),
            "can_act": self.guard.can_act(request),
            "needs_login": self.guard.needs_login(request),
            "read_only": self.guard.read_only,
            "token_login": self.guard.token is not None,
            "csrf": auth.csrf_token(request),
            "refresh": self.settings.refresh,
        }

    def render_screen(self, request: Request, urls: MapAdapter, screen: views.Screen, now: Any) -> Response:
        common = self.common(request, urls)
        rendered = {
            name: self.templates.get_template(template).render(**common, **context)
            for name, (template, context) in screen.fragments.items()
        }
        regions = {name: render.live_region(name, html) for name, html in rendered.items()}
        if request.args.get("live"):
            body = "".join(regions.values())
            etag = render.content_hash(body)
            if etag in request.if_none_match:
                response = Response(status=304)
            else:
                response = Response(body, mimetype="text/html")
            response.set_etag(etag)
            response.headers["X-Postjob-Now"] = render.iso(now)
            response.headers["Cache-Control"] = "no-cache"
            return response
        notice = actions.DONE.get(request.args.get("done", ""))
        html = self.templates.get_template(screen.template).render(
            **common, **screen.context, title=screen.title, regions=regions, notice=notice,
            now=render.iso(now), page=screen.template,
        )
        return Response(html, mimetype="text/html", headers={"Cache-Control": "no-cache"})

    def error_page(self, request: Request, urls: MapAdapter, status: int, message: str) -> Response:
        html = self.templates.get_template("error.html").render(
            **self.common(request, urls), title=f"Error {status}", status=status,
            message=message, back=_same_site(request, request.referrer),
            regions={}, notice=None, now="", page="error.html",
        )
        return Response(html, status=status, mimetype="text/html")

    # -- pages ---------------------------------------------------------------------------------

    def _screen(self, request: Request, urls: MapAdapter, build: Callable[..., views.Screen], *args: Any) -> Response:
        with q.reading(self.engine) as conn:
            screen = build(conn, *args)
            now = q.db_now(conn)
        return self.render_screen(request, urls, screen, now)

    def on_overview(self, request: Request, urls: MapAdapter) -> Response:
        return self._screen(request, urls, views.overview, self.settings, self.throughput)

    def on_jobs(self, request: Request, urls: MapAdapter) -> Response:
        wanted = request.args.get("id", "").strip().lstrip("#")
        if wanted:  # the header's "job id" box
            if not wanted.isdigit() or not 0 < int(wanted) <= MAX_ID:
                raise InvalidArgument(f"not a job id: {wanted!r}")
            return redirect(urls.build("job", {"job_id": int(wanted)}), 303)
        return self._screen(request, urls, views.jobs, request.args, self.settings)

    def on_job(self, request: Request, urls: MapAdapter, job_id: int) -> Response:
        return self._screen(request, urls, views.job, job_id, self.settings)

    def on_schedules(self, request: Request, urls: MapAdapter) -> Response:
        return self._screen(request, urls, views.schedules)

    def on_history(self, request: Request, urls: MapAdapter) -> Response:
        return self._screen(request, urls, views.history)

    def on_static(self, request: Request, urls: MapAdapter, name: str) -> Response:
        asset = self.assets.get(name)
        if asset is None:
            raise NotFound(f"no file {name}")
        response = Response(asset.body, mimetype=asset.mimetype)
        response.set_etag(asset.etag)
        response.headers["Cache-Control"] = "public, max-age=86400"
        return response.make_conditional(request)

    # -- actions -------------------------------------------------------------------------------

    def _done(self, urls: MapAdapter, job_id: int, what: str) -> Response:
        return redirect(urls.build("job", {"job_id": job_id, "done": what}), 303)

    def on_reset(self, request: Request, urls: MapAdapter, job_id: int) -> Response:
        self.guard.require_action(request)
        return self._done(urls, job_id, actions.reset(self.engine, job_id))

    def on_force(self, request: Request, urls: MapAdapter, job_id: int) -> Response:
        self.guard.require_action(request)
        return self._done(urls, job_id, actions.force(self.engine, job_id))

    def on_cancel(self, request: Request, urls: MapAdapter, job_id: int) -> Response:
        self.guard.require_action(request)
        return self._done(urls, job_id, actions.cancel(self.engine, job_id))

    def on_resolve(self, request: Request, urls: MapAdapter) -> Response:
        self.guard.require_action(request)
        job_id, what = actions.resolve(self.engine, request.form)
        back = request.form.get("back", "")
        target = int(back) if back.isdigit() and 0 < int(back) <= MAX_ID else job_id
        return self._done(urls, target, what)

    def on_login(self, request: Request, urls: MapAdapter) -> Response:
        if self.guard.token is None or self.guard.read_only:
            raise NotFound("this dashboard has no login: " + (
                "it is read-only" if self.guard.read_only else "its host decides who may act"))
        failed = False
        if request.method == "POST":
            auth.require_same_origin(request)
            if self.guard.check_token(request.form.get("token", "")):
                response = redirect(urls.build("overview", {}), 303)
                self.guard.log_in(response, request)
                return response
            failed = True
        html = self.templates.get_template("login.html").render(
            **self.common(request, urls), title="Log in", failed=failed, regions={},
            notice=None, now="", page="login.html",
        )
        return Response(html, status=403 if failed else 200, mimetype="text/html")

    def on_logout(self, request: Request, urls: MapAdapter) -> Response:
        auth.require_same_origin(request)
        response = redirect(urls.build("overview", {}), 303)
        response.delete_cookie(auth.SESSION_COOKIE, path=auth.cookie_path(request))
        return response

