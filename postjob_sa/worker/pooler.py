"""Whether a worker that was not told ``pooled`` reaches the database through a pooler in
transaction mode (PgBouncer's ``pool_mode = transaction``); if so, it runs as if it had been.

There a session lasts one transaction: a worker's LISTEN, its prepared statements and its
session settings are gone (or handed to another client) once the transaction ends, so the
worker would lose its wake-ups silently (psycopg2) or fail on a prepared statement later
(psycopg 3). The probe asks two questions, once per engine, before a worker is built:

- does our LISTEN survive into the next transaction? (A strict pooler, ``DISCARD ALL`` after
  every transaction, forgets it.)
- does a second connection from the same engine see our LISTEN? (A pooler that does not reset
  hands the same server session to the next client; two direct connections never share one.)

A pooler found is said once per database URL in a process (``drain`` may be called in a loop).
"""

from __future__ import annotations

import logging
import threading
import weakref

from sqlalchemy import URL, Engine

from postjob_sa import _sql
from postjob_sa._db import Conn

log = logging.getLogger("postjob_sa.worker")

#: What a worker that was not told ``pooled`` logs when the probe finds a pooler (``{}``: what
#: it saw, then how it is woken: WAKE_BY_POLL or WAKE_BY_URL).
DETECTED = (
    "the database URL goes through a pooler in transaction mode (PgBouncer?): {}, so the "
    "worker runs as --pooled (pooled=True): no LISTEN, prepared statements or session "
    "settings on its connections; {} (give --pooled yourself to skip this check)"
)
WAKE_BY_POLL = ("give --wakeup-url (wakeup_url=) a direct URL to the database to be woken at "
                "once: without it, the worker looks for jobs every {:g} s")
WAKE_BY_URL = "it is woken through the direct --wakeup-url"


def transaction_pooling(conn: Conn, engine: Engine) -> str | None:
    """What shows that ``conn`` (autocommit, from ``engine``) goes through a pooler in
    transaction mode, or None for a connection that keeps its session."""
    conn.rows(_sql.POOLER_PROBE_LISTEN)
    try:
        if not conn.scalar(_sql.POOLER_PROBE_LISTENING):
            return "its LISTEN was gone one transaction later"
        other = Conn.open(engine, pooled=True, probe=True)
        try:
            if other.scalar(_sql.POOLER_PROBE_LISTENING):
                return "a second connection was handed the same server session"
        finally:
            other.close()
        return None
    finally:
        conn.rows(_sql.POOLER_PROBE_UNLISTEN)


_found: weakref.WeakKeyDictionary[Engine, str | None] = weakref.WeakKeyDictionary()
_said: set[URL] = set()
_lock = threading.Lock()


def probed(engine: Engine) -> str | None:
    """:func:`transaction_pooling` of a connection of the engine's, asked once per engine."""
    with _lock:
        if engine in _found:
            return _found[engine]
    conn = Conn.open(engine, pooled=True, probe=True)  # nothing of the probe may outlive it
    try:
        found = transaction_pooling(conn, engine)
    finally:
        conn.close()
    with _lock:
        _found[engine] = found
    return found


def pooled(engine: Engine, wakeup_url: URL | None, poll_interval: float) -> bool:
    """Whether a worker that was not told ``pooled`` must run as pooled on this engine; the
    first time a URL is found pooled in this process, one warning says so (and how the
    worker is woken: through ``wakeup_url``, or by looking every ``poll_interval``)."""
    found = probed(engine)
    if found is None:
        return False
    with _lock:
        new = engine.url not in _said
        _said.add(engine.url)
    if new:
        wake = WAKE_BY_URL if wakeup_url is not None else WAKE_BY_POLL.format(poll_interval)
        log.warning(DETECTED.format(found, wake))
    return True
