"""HTTP Basic authentication in front of a WSGI app: how the examples keep the postjob
dashboard to their administrators. Use your app's own login in a real one."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Callable, Iterable
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def basic_auth(app: WSGIApp, password: str | None, *, user: str = "admin") -> WSGIApp:
    """``app`` for requests that bring ``user:password``; everyone else gets 401. Without a
    password nobody gets in."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_AUTHORIZATION", "")
        if password and header.startswith("Basic "):
            try:
                given_user, _, given = base64.b64decode(header[6:], validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                given_user, given = "", ""
            if hmac.compare_digest(f"{given_user}:{given}".encode(), f"{user}:{password}".encode()):
                return app(environ, start_response)
        start_response("401 Unauthorized", [
            ("WWW-Authenticate", 'Basic realm="postjob dashboard"'), ("Content-Type", "text/plain"),
        ])
        return [b"authentication required\n"]

    return guarded
