"""Our revisions' scripts on asyncpg: sent whole, unprepared.

A revision runs strings of many statements (``op.execute(SCHEMA_SQL)``). psycopg sends a
string without parameters as it is; SQLAlchemy's asyncpg driver prepares every statement, and
PostgreSQL refuses to prepare more than one command. While our revisions run on a connection
(:func:`scripts_sent_whole`), such a string goes to asyncpg's own ``execute()``, which sends it
unprepared, in one round trip: the SQL is the same on every driver, and offline SQL does not
change. Everything else (a statement with parameters, one whose rows are read) goes the
usual way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, event
from sqlalchemy.util import await_only

#: Set in the connection's ``info`` while our revisions run on it (a depth: calls nest).
_ACTIVE = "postjob_sa.scripts_sent_whole"


@contextlib.contextmanager
def scripts_sent_whole(conn: Connection) -> Iterator[None]:
    """While the block runs, strings of several statements without parameters executed on
    ``conn`` go to asyncpg unprepared. Nothing changes on other drivers."""
    if conn.dialect.driver != "asyncpg":
        yield
        return
    if not event.contains(conn.dialect, "do_execute", _send_whole):
        # on the dialect of this engine (every connection of it): the flag picks ours
        event.listen(conn.dialect, "do_execute", _send_whole)
    depth = int(conn.info.get(_ACTIVE, 0))
    conn.info[_ACTIVE] = depth + 1
    try:
        yield
    finally:
        if depth:
            conn.info[_ACTIVE] = depth
        else:
            conn.info.pop(_ACTIVE, None)


def is_script(statement: str) -> bool:
    """Whether ``statement`` may hold more than one command: a ``;`` before its end. A single
    statement with one inside (a function's body) is sent whole as well, which runs it the
    same."""
    return ";" in statement.rstrip().rstrip(";")


def _send_whole(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
    """SQLAlchemy's ``do_execute`` hook: True when the statement was sent here."""
    conn = context.root_connection
    if parameters or not conn.info.get(_ACTIVE) or not is_script(statement):
        return False
    # an empty statement through the driver's cursor: as any first statement (DBAPI), it
    # begins the transaction the driver keeps for SQLAlchemy (none in autocommit)
    cursor.execute(";")
    adapted = conn.connection.dbapi_connection
    try:
        await_only(conn.connection.driver_connection.execute(statement))
    except Exception as error:
        # raises the driver's DBAPI error (its sqlstate kept), which SQLAlchemy wraps
        adapted._handle_exception(error)
    return True
