"""Waiting for work: NOTIFY postjob_notifications on the worker's own connection.

The worker LISTENs on the same connection it checks out with. A notification wakes that
connection's server process, so the checkout that follows runs on a backend that is already
awake (with a separate LISTEN connection it would first have to be woken: a few tenths of a
millisecond on every wake-up). If the connection drops while waiting, the error reaches the
worker loop, which reconnects with back-off and LISTENs again.
"""

from __future__ import annotations

import select
from typing import Any

from postjob_sa import _sql


def listen(conn: Any) -> None:
    with conn.cursor() as cur:
        cur.execute(_sql.LISTEN_DBAPI)


def wait(conn: Any, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a notification; True if one arrived."""
    if conn.notifies:  # arrived while the connection was busy (e.g. during a job)
        conn.notifies.clear()
        return True
    if timeout <= 0:
        return False
    readable, _, _ = select.select([conn], [], [], timeout)
    if not readable:
        return False
    conn.poll()  # raises if the connection was lost
    woken = bool(conn.notifies)
    conn.notifies.clear()
    return woken
