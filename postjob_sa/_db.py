"""The worker's boundary to the database.

A worker owns its connections: each is taken from the application's engine and detached from its
pool, so the engine's ``connect_args``, ``creator`` and connect events (SSL, IAM tokens,
``statement_timeout``) apply, while the application's pool keeps its size. Both psycopg drivers
sit behind :class:`Conn`: statements use ``%(name)s`` placeholders (both drivers accept them),
rows come back by column name, and :meth:`Conn.failure` says what an error means for the worker.
"""

from __future__ import annotations

import enum
import os
import re
import select
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, NoSuchModuleError

from postjob_sa import _sql
from postjob_sa.errors import InvalidArgument

#: SQLAlchemy driver names postjob_sa works with, and how to ask for each in a URL. A bare
#: ``postgresql://`` means SQLAlchemy's default: psycopg 3 from SQLAlchemy 2.1 on, psycopg2 before.
SUPPORTED_DRIVERS = {"psycopg": "postgresql+psycopg://", "psycopg2": "postgresql+psycopg2://"}
#: How each driver is called in prose.
DRIVER_LABELS = {"psycopg": "psycopg 3", "psycopg2": "psycopg2"}

#: A named placeholder of the worker's statements (``%(name)s``).
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
#: SQLSTATEs of a connection that is gone or refused (besides class 08, connection exception).
_CONNECTION_STATES = {"57P01", "57P02", "57P03", "53300"}
#: SQLSTATEs worth trying again as they are: another transaction was in the way.
_TRANSIENT_STATES = {"40P01", "40001", "55P03"}
#: SQLSTATE classes of a value the database refused (data exception, integrity constraint,
#: program limit): the outcome that carried it is at fault, not the worker.
_DATA_CLASSES = {"22", "23", "54"}

#: What to do when a worker behind a pooler finds another default isolation level.
POOLED_ISOLATION_ADVICE = ("set it to read committed for the worker's role (alter role ... set "
                           "default_transaction_isolation = 'read committed')")


class Failure(enum.Enum):
    """What a failed statement means for the worker."""

    CONNECTION = "connection"  # the connection is gone: reconnect with back-off
    TRANSIENT = "transient"  # a deadlock or serialization conflict: try again, a few times
    DATA = "data"  # the database refused a value: fail the job that carried it
    FATAL = "fatal"  # anything else (permissions, a missing function): stop and say so


def unsupported_driver(what: str) -> InvalidArgument:
    """The one error for a driver other than the two supported ones (``what`` names it)."""
    return InvalidArgument(
        f"postjob_sa works with PostgreSQL through psycopg 3 or psycopg2, not {what}: use a "
        f"postgresql://, {' or '.join(SUPPORTED_DRIVERS.values())} URL"
    )


def _check(name: str, driver: str, is_async: bool) -> str:
    if name != "postgresql" or driver not in SUPPORTED_DRIVERS or is_async:
        raise unsupported_driver(f"{name}+{driver}{' (asyncio)' if is_async else ''}")
    return driver


def check_driver(engine: Engine) -> str:
    """The engine's driver name, or InvalidArgument naming the supported ones (a worker's
    connections: sync psycopg 3 or psycopg2)."""
    return _check(engine.dialect.name, str(engine.dialect.driver), engine.dialect.is_async)


#: What the Session API also runs on: the async drivers of an AsyncSession (AsyncJobQueue).
ASYNC_SESSION_DRIVERS = ("psycopg", "asyncpg")


def check_session_driver(engine: Engine) -> str:
    """:func:`check_driver` for the statements of the Session API, which an AsyncSession may
    also run through psycopg 3's async driver or asyncpg."""
    dialect = engine.dialect
    if dialect.is_async and dialect.name == "postgresql" and dialect.driver in ASYNC_SESSION_DRIVERS:
        return str(dialect.driver)
    return check_driver(engine)


def check_url(url: URL) -> str:
    """The driver a URL means (as SQLAlchemy resolves it: ``postgresql://`` is its default
    driver), or InvalidArgument naming the supported ones. Imports no driver."""
    try:
        dialect = url.get_dialect()
    except NoSuchModuleError:
        raise unsupported_driver(url.drivername) from None
    return _check(str(dialect.name), str(dialect.driver), bool(dialect.is_async))


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error (either driver, wrapped by SQLAlchemy or not)."""
    if isinstance(exc, DBAPIError):
        exc = exc.orig  # type: ignore[assignment]
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return str(state) if state else None


def failure(exc: BaseException) -> Failure:
    """Classify an error raised by a statement (see :class:`Failure`)."""
    if isinstance(exc, UnicodeError):  # the driver could not encode a value
        return Failure.DATA
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return Failure.CONNECTION
        exc = exc.orig  # type: ignore[assignment]
    state = sqlstate(exc)
    if state is None:
        # no server answer: the driver lost the connection (OperationalError, InterfaceError)
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & {"OperationalError", "InterfaceError"}:
            return Failure.CONNECTION
        return Failure.DATA if "DataError" in names else Failure.FATAL
    if state.startswith("08") or state in _CONNECTION_STATES:
        return Failure.CONNECTION
    if state in _TRANSIENT_STATES:
        return Failure.TRANSIENT
    if state[:2] in _DATA_CLASSES:
        return Failure.DATA
    return Failure.FATAL


class Conn:
    """One DBAPI connection in autocommit mode, owned by a worker (or borrowed, see
    :meth:`borrow`), with the differences between the drivers kept in here."""

    def __init__(self, raw: Any, driver: str, *, owned: bool = True):
        self.raw = raw
        self.driver = driver
        self.owned = owned
        self._notified = False
        self._payloads: list[str] = []  # of the notifications that carried one, not yet taken
        #: whether this connection may keep prepared statements (not behind a pooler)
        self.may_prepare = False
        self._prepared: dict[str, str] = {}  # statement -> its EXECUTE
        if driver == "psycopg":
            raw.add_notify_handler(self._on_notify)

    @classmethod
    def open(cls, engine: Engine, *, name: str | None = None, pooled: bool = False,
             probe: bool = False) -> Conn:
        """A new connection of the worker's own, made by the engine's pool and detached.

        ``name`` shows in ``pg_stat_activity``. The worker's statements run at READ COMMITTED
        whatever the database's default (its functions lock rows and then read them: at a
        higher level a read would see a snapshot from before the lock). Both are session
        settings, so not ``pooled``: behind a pooler in transaction mode nothing may outlive a
        transaction (and psycopg 3 must not prepare statements on the server either); there a
        default other than READ COMMITTED is refused (:class:`InvalidArgument`, with what to
        run). A ``probe`` (is there a pooler?) runs no statement of its own."""
        driver = check_driver(engine)
        fairy = engine.raw_connection()
        fairy.detach()
        raw = fairy.dbapi_connection
        assert raw is not None
        raw.rollback()  # no round trip unless the pool left a transaction open
        raw.autocommit = True
        conn = cls(raw, driver)
        if pooled:
            no_prepared_statements(raw, driver)
        else:
            conn.may_prepare = True
        try:
            if probe:
                pass
            elif not pooled:
                conn.scalar(_sql.WORKER_SESSION_SET, {"name": name})
            elif (level := conn.scalar(_sql.ISOLATION_LEVEL)) != "read committed":
                raise InvalidArgument(
                    f"the database's default_transaction_isolation is {level!r}, and a worker "
                    "behind a pooler cannot set its own: " + POOLED_ISOLATION_ADVICE)
        except BaseException:
            conn.close()
            raise
        return conn

    @classmethod
    def borrow(cls, dbapi_connection: Any, driver: str) -> Conn:
        """A view of someone else's connection (e.g. a transactional job's), never closed."""
        return cls(dbapi_connection, driver, owned=False)

    # -- statements ----------------------------------------------------------------------------

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run one statement; its rows as dicts by column name."""
        cur = self.raw.cursor()
        try:
            cur.execute(sql, params)
            if cur.description is None:
                return []
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        finally:
            cur.close()

    def tuples(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement; its rows as tuples, in the statement's column order (the
        worker's hot path: no dict per row)."""
        cur = self.raw.cursor()
        try:
            cur.execute(sql, params)
            return [] if cur.description is None else list(cur.fetchall())
        finally:
            cur.close()

    def prepared_tuples(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """:meth:`tuples` of a statement the connection prepares on the server the first time
        (psycopg2, which never prepares by itself, on a connection of the worker's own; psycopg
        3 prepares a statement run often by itself): parsed and planned once per connection."""
        if self.driver != "psycopg2" or not self.may_prepare:
            return self.tuples(sql, params)
        execute = self._prepared.get(sql)
        if execute is None:
            execute = self._prepare(sql)
        return self.tuples(execute, params)

    def _prepare(self, sql: str) -> str:
        """PREPARE a statement of postjob_sa._sql (a constant: no input reaches it) under a name
        of this connection's; returns the EXECUTE that runs it with the same parameters."""
        names = list(dict.fromkeys(_PLACEHOLDER.findall(sql)))
        name = "postjob_" + str(len(self._prepared))
        body = _PLACEHOLDER.sub(lambda m: "$" + str(names.index(m.group(1)) + 1), sql)
        self.tuples("PREPARE " + name + " AS " + body)
        execute = "EXECUTE " + name + "(" + ", ".join("%(" + n + ")s" for n in names) + ")"
        self._prepared[sql] = execute
        return execute

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        """Run one statement; the first column of its first row, or None."""
        cur = self.raw.cursor()
        try:
            cur.execute(sql, params)
            row = cur.fetchone() if cur.description is not None else None
            return None if row is None else row[0]
        finally:
            cur.close()

    # -- wake-ups ------------------------------------------------------------------------------

    def _on_notify(self, notify: Any) -> None:
        self._notified = True
        self._note(notify.payload)

    def _note(self, payload: str) -> None:
        if payload and len(self._payloads) < 100:  # (a busy worker takes none for a while)
            self._payloads.append(payload)

    def take_payloads(self) -> list[str]:
        """The payloads of the notifications that arrived since the last call."""
        payloads, self._payloads = self._payloads, []
        return payloads

    def listen(self, channel_sql: str) -> None:
        self.rows(channel_sql)

    def take_notification(self) -> bool:
        """Whether a notification arrived since the last call (during any statement)."""
        if self.driver == "psycopg":
            woken, self._notified = self._notified, False
            return woken
        if self.raw.notifies:
            for notify in self.raw.notifies:
                self._note(notify.payload)
            self.raw.notifies.clear()
            return True
        return False

    def wait(self, timeout: float, wake_fd: int | None = None,
             other_fds: Sequence[int] = ()) -> bool:
        """Wait up to ``timeout`` seconds for a notification (or for ``wake_fd`` or one of
        ``other_fds`` to become readable); raises if the connection is lost."""
        if self.take_notification():
            return True
        if timeout <= 0:
            return False
        extra = [*([] if wake_fd is None else [wake_fd]), *other_fds]
        readable, _, _ = select.select([self.raw.fileno(), *extra], [], [], timeout)
        if any(fd in readable for fd in extra):
            return False
        if not readable:
            return False
        return self.read_notifications()

    def read_notifications(self) -> bool:
        """Read what the server sent (call when the socket is readable); True if it holds a
        notification. Raises if the connection is lost."""
        if self.driver == "psycopg":
            pgconn = self.raw.pgconn
            pgconn.consume_input()  # raises OperationalError when the server has gone
            woken = self._notified
            while (notify := pgconn.notifies()) is not None:
                woken = True
                self._note(notify.extra.decode(errors="replace"))
            self._notified = False
            return woken
        self.raw.poll()  # raises OperationalError when the server has gone
        return self.take_notification()

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)

    def close(self) -> None:
        if not self.owned:
            return
        try:
            self.raw.close()
        except Exception:  # already broken: nothing left to release
            pass


def no_prepared_statements(dbapi_connection: Any, driver: str) -> None:
    """psycopg 3 prepares a statement on the server after a few runs: not behind a pooler in
    transaction mode, where the next transaction may run on another server connection
    (psycopg2 prepares nothing)."""
    if driver == "psycopg":
        dbapi_connection.prepare_threshold = None


def worker_identifier() -> str:
    """How ``ps`` names this worker process: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def close_quietly(conn: Conn | None) -> None:
    if conn is not None:
        conn.close()
