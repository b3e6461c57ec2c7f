"""Whether a worker that was not told ``pooled`` reaches the database through a pooler in
transaction mode (PgBouncer's ``pool_mode = transaction``).

There a session lasts one transaction: a worker's LISTEN, its prepared statements and its
session settings are gone (or handed to another client) once the transaction ends, so the
worker would lose its wake-ups silently (psycopg2) or fail on a prepared statement later
(psycopg 3). The probe asks two questions, once, when a long-running worker starts:

- does our LISTEN survive into the next transaction? (A strict pooler, ``DISCARD ALL`` after
  every transaction, forgets it.)
- does a second connection from the same engine see our LISTEN? (A pooler that does not reset
  hands the same server session to the next client; two direct connections never share one.)
"""

from __future__ import annotations

from sqlalchemy import Engine

from postjob_sa import _sql
from postjob_sa._db import Conn
from postjob_sa.errors import InvalidArgument

#: What the worker says when the probe finds a pooler (``{}``: what it saw).
POOLED_HINT = (
    "the database URL goes through a pooler in transaction mode (PgBouncer?): {}, so LISTEN, "
    "prepared statements and session settings do not last: run the worker with --pooled "
    "(JobQueue(..., pooled=True)), and --wakeup-url (wakeup_url=) with a direct URL to be "
    "woken at once"
)


def transaction_pooling(conn: Conn, engine: Engine) -> str | None:
    """What shows that ``conn`` (autocommit, from ``engine``) goes through a pooler in
    transaction mode, or None for a connection that keeps its session."""
    conn.rows(_sql.POOLER_PROBE_LISTEN)
    try:
        if not conn.scalar(_sql.POOLER_PROBE_LISTENING):
            return "its LISTEN was gone one transaction later"
        other = Conn.open(engine, pooled=True)
        try:
            if other.scalar(_sql.POOLER_PROBE_LISTENING):
                return "a second connection was handed the same server session"
        finally:
            other.close()
        return None
    finally:
        conn.rows(_sql.POOLER_PROBE_UNLISTEN)


def refuse_transaction_pooling(conn: Conn, engine: Engine) -> None:
    """:class:`InvalidArgument` with the flag to use, when :func:`transaction_pooling` finds
    a pooler."""
    found = transaction_pooling(conn, engine)
    if found is not None:
        raise InvalidArgument(POOLED_HINT.format(found))
