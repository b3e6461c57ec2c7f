"""Who may act, and proof that a POST came from the dashboard's own form.

* **Read-only** mode: no action at all, whoever asks.
* **Token**: with a secret (``postjob web --token``), an action needs the session cookie that
  ``/login`` sets after checking the secret, or an ``Authorization: Bearer <secret>`` header
  (a script's: it needs no CSRF proof). The cookie holds the time of the login, a random
  value and an HMAC of both under the secret (never the secret itself); it lasts
  ``session_max_age`` seconds (12 hours), which the server checks, and changing the secret
  ends every session.
* **No token** (a host mounts the app): every request that reaches the dashboard may act; the
  host's own authentication decides who reaches it.
* **CSRF**: every POST without the bearer carries a form field equal to the ``postjob_csrf`` cookie (random,
  SameSite=Strict, HttpOnly), and a browser's ``Origin`` / ``Sec-Fetch-Site`` headers, when
  sent, must name this site.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Request, Response

CSRF_COOKIE = "postjob_csrf"
CSRF_FIELD = "csrf"
SESSION_COOKIE = "postjob_session"
#: How long a login lasts (the cookie's Max-Age, and the server's check of its signed time).
SESSION_MAX_AGE = 12 * 3600.0
_SESSION_MESSAGE = "postjob web session v2"
#: A cookie signed this far in the future is refused (clocks of several servers may differ).
_CLOCK_SKEW = 60


def _signature(token: str, issued: int, nonce: str) -> str:
    message = f"{_SESSION_MESSAGE}|{issued}|{nonce}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def _new_session(token: str, now: float) -> str:
    """``<issued>.<nonce>.<HMAC of both under the token>``: each login its own value, and
    changing the token ends every session."""
    issued, nonce = int(now), secrets.token_urlsafe(12)
    return f"{issued}.{nonce}.{_signature(token, issued, nonce)}"


def _valid_session(token: str, value: str, now: float, max_age: float) -> bool:
    parts = value.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 12:
        return False
    issued, nonce, mac = int(parts[0]), parts[1], parts[2]
    if not hmac.compare_digest(mac.encode(), _signature(token, issued, nonce).encode()):
        return False
    return -_CLOCK_SKEW <= now - issued < max_age


def cookie_path(request: Request) -> str:
    return (request.script_root or "") + "/"


@dataclass(frozen=True)
class Guard:
    """The access policy of one dashboard."""

    token: str | None = None
    read_only: bool = False
    session_max_age: float = SESSION_MAX_AGE
    clock: Callable[[], float] = time.time

    def can_act(self, request: Request) -> bool:
        """Whether this request may run actions (its CSRF proof is checked separately)."""
        if self.read_only:
            return False
        if self.token is None:
            return True
        if self.bearer(request):
            return True
        cookie = request.cookies.get(SESSION_COOKIE, "")
        return _valid_session(self.token, cookie, self.clock(), self.session_max_age)

    def bearer(self, request: Request) -> bool | None:
        """Whether the request carries ``Authorization: Bearer <the token>``: None without a
        bearer (or without a token), False with another one."""
        header = request.headers.get("Authorization", "")
        if self.token is None or not header.startswith("Bearer "):
            return None
        return hmac.compare_digest(header[7:].encode(), self.token.encode())

    def needs_login(self, request: Request) -> bool:
        return not self.read_only and self.token is not None and not self.can_act(request)

    def check_token(self, offered: str) -> bool:
        return self.token is not None and hmac.compare_digest(offered.encode(), self.token.encode())

    def log_in(self, response: Response, request: Request) -> None:
        assert self.token is not None
        response.set_cookie(
            SESSION_COOKIE, _new_session(self.token, self.clock()), path=cookie_path(request),
            max_age=int(self.session_max_age), httponly=True, samesite="Strict",
            secure=request.is_secure,
        )

    def require_action(self, request: Request) -> None:
        """Raise Forbidden unless this POST may act: not read-only, and either a script's
        bearer token or an authorised browser proven to come from the dashboard's own page
        (CSRF). A bearer needs no CSRF proof: a browser never adds that header by itself (a
        page of another site cannot send it without a CORS preflight, which this dashboard
        never grants), while it does send the session cookie."""
        if self.read_only:
            raise Forbidden("the dashboard is read-only")
        bearer = self.bearer(request)
        if bearer is False:  # a script with the wrong secret should hear so
            raise Forbidden("the bearer token is not this dashboard's token")
        if bearer:
            require_same_site(request)
            return
        require_same_origin(request)
        if not self.can_act(request):
            raise Forbidden("actions need the dashboard's token: log in first")


def csrf_token(request: Request) -> str:
    """The CSRF value for this browser (from its cookie, or a new one the response sets)."""
    existing = request.cookies.get(CSRF_COOKIE, "")
    if len(existing) >= 32:
        return existing
    fresh: str | None = request.environ.get("postjob.csrf_new")
    if fresh is None:
        fresh = secrets.token_urlsafe(32)
        request.environ["postjob.csrf_new"] = fresh
    return fresh


def set_csrf_cookie(request: Request, response: Response) -> None:
    fresh = request.environ.get("postjob.csrf_new")
    if fresh:
        response.set_cookie(
            CSRF_COOKIE, fresh, path=cookie_path(request), httponly=True, samesite="Strict",
            secure=request.is_secure,
        )


def require_same_site(request: Request) -> None:
    """Raise Forbidden if a browser says this request comes from another site."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        raise Forbidden("cross-site request refused")
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise Forbidden("cross-origin request refused")


def require_same_origin(request: Request) -> None:
    """Raise Forbidden unless this POST carries the CSRF proof and, where the browser says
    where it came from, comes from this site."""
    require_same_site(request)
    cookie = request.cookies.get(CSRF_COOKIE, "")
    offered = request.form.get(CSRF_FIELD, "")
    if len(cookie) < 32 or not hmac.compare_digest(cookie.encode(), offered.encode()):
        raise Forbidden("the form has expired or did not come from this dashboard: reload the page")
