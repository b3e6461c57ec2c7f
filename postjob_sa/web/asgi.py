"""A small WSGI-to-ASGI adapter, so an ASGI host (FastAPI, Starlette) can mount the dashboard:
``app.mount("/jobs", postjob_sa.web.as_asgi(dashboard))``. Each request's body is read
whole (up to a limit), the WSGI app runs in a worker thread, and its response is sent in one
piece: every dashboard response is small and finite.

Where the dashboard is mounted reaches WSGI as ``SCRIPT_NAME``, which every link is built
from. Starlette says it in ``root_path``; a host that strips the mount from the path and says
nothing (Litestar) needs ``mount_path``."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from postjob_sa.errors import InvalidArgument

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

MAX_BODY = 1 << 20  # a dashboard form is a few hundred bytes


def _mount(mount_path: str | None) -> str:
    """The mount path as SCRIPT_NAME spells it: ``/admin/jobs``, ``""`` for the root."""
    if mount_path is None:
        return ""
    if (not isinstance(mount_path, str) or not mount_path.startswith("/")
            or any(c in mount_path for c in "?#%\\ ") or "//" in mount_path):
        raise InvalidArgument(f"mount_path must be a path such as '/admin/jobs', not {mount_path!r}")
    return mount_path.rstrip("/")


def _split(scope: Scope, mount: str) -> tuple[str, str]:
    """SCRIPT_NAME and PATH_INFO of an ASGI request."""
    root = scope.get("root_path", "")
    path = scope["path"]
    # a host that names the mount in root_path (Starlette) has said it already
    script = root if not mount or root.endswith(mount) else root + mount
    for prefix in (script, root):  # ASGI 3: path includes root_path
        if prefix and (path == prefix or path.startswith(prefix + "/")):
            return script, path[len(prefix):]
    return script, path


def _environ(scope: Scope, body: bytes, mount: str = "") -> dict[str, Any]:
    root, path = _split(scope, mount)
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client") or ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": root,
        "PATH_INFO": path,
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 80),
        "SERVER_PROTOCOL": "HTTP/" + scope.get("http_version", "1.1"),
        "REMOTE_ADDR": client[0],
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "CONTENT_LENGTH": str(len(body)),
    }
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        if name == "CONTENT_TYPE":
            environ["CONTENT_TYPE"] = value
        elif name != "CONTENT_LENGTH":
            key = "HTTP_" + name
            environ[key] = environ[key] + "," + value if key in environ else value
    return environ


def _call(app: WSGIApp, environ: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        started[:] = [status, headers]
        return lambda data: None  # the dashboard never writes through write()

    result = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    return (
        int(status.split(" ", 1)[0]),
        [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        body,
    )


def as_asgi(app: WSGIApp, *, mount_path: str | None = None,
            max_body: int = MAX_BODY) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The WSGI ``app`` as an ASGI application (HTTP only; it ignores lifespan events).

    ``mount_path`` is where the host mounts it, for a host that strips it from the request's
    path without adding it to ``root_path`` (Litestar's ``asgi(path, is_mount=True)``): every
    link, form and asset of the dashboard then starts with it. Starlette and FastAPI need none.
    """
    mount = _mount(mount_path)

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            raise RuntimeError(f"the dashboard serves HTTP only, not {scope['type']}")
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                await send({"type": "http.response.start", "status": 413, "headers": []})
                await send({"type": "http.response.body", "body": b"request body too large"})
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        loop = asyncio.get_running_loop()
        status, headers, body = await loop.run_in_executor(None, _call, app, _environ(scope, b"".join(chunks), mount))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return asgi
