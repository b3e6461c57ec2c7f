"""Waiting for work: LISTEN postjob_notifications on a connection of its own."""

from __future__ import annotations

import logging
import select
import time
from typing import Any

from sqlalchemy import Engine

from postjob_sa import _sql
from postjob_sa._connections import close_quietly, connect

log = logging.getLogger("postjob_sa.worker")

#: How long to sleep per wait while the LISTEN connection is down (we poll instead).
POLL_WITHOUT_LISTEN = 1.0


class Listener:
    """Blocks until a notification arrives or the timeout passes.

    If the LISTEN connection drops, waits degrade to short polls and the next wait
    re-connects and LISTENs again.
    """

    def __init__(self, engine: Engine):
        self._engine = engine
        self._conn: Any = None
        self.reconnects = 0

    @property
    def listening(self) -> bool:
        return self._conn is not None

    def _ensure(self) -> bool:
        if self._conn is not None:
            return True
        try:
            conn = connect(self._engine)
            with conn.cursor() as cur:
                cur.execute(_sql.LISTEN_DBAPI)
        except Exception as exc:
            log.warning("cannot LISTEN for new jobs (%s); polling instead", _one_line(exc))
            return False
        self._conn = conn
        return True

    def start(self) -> None:
        self._ensure()

    def wait(self, timeout: float) -> bool:
        """Wait up to timeout seconds; True if woken by a notification (or a reconnect)."""
        if timeout <= 0:
            return True
        had_conn = self._conn is not None
        if not self._ensure():
            time.sleep(min(timeout, POLL_WITHOUT_LISTEN))
            return False
        if not had_conn:
            self.reconnects += 1
            return True  # notifications may have been missed while we were not listening
        conn = self._conn
        try:
            if conn.notifies:
                conn.notifies.clear()
                return True
            readable, _, _ = select.select([conn], [], [], timeout)
            if not readable:
                return False
            conn.poll()
            woken = bool(conn.notifies)
            conn.notifies.clear()
            return woken
        except Exception as exc:
            log.warning("the LISTEN connection dropped (%s); re-listening", _one_line(exc))
            self.close()
            return True

    def close(self) -> None:
        close_quietly(self._conn)
        self._conn = None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
