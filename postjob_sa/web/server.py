"""The standalone server of ``postjob web``: the standard library's WSGI server, one thread per
request (a dashboard has few users; every request is short)."""

from __future__ import annotations

import logging
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger("postjob_sa.web")


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)


def server(app: Any, host: str = "127.0.0.1", port: int = 8008) -> WSGIServer:
    """A threaded WSGI server for ``app`` bound to host:port (port 0: any free port);
    call ``serve_forever()`` on it, and ``shutdown()`` from another thread to stop it."""
    return make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
