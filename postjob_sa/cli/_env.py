"""Which database the CLI talks to, and the engine it uses. Passwords never leave this module
unredacted: everything printed goes through :func:`redact`."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from postjob_sa._db import check_url
from postjob_sa._sync_url import SYNC_DRIVERNAME, is_async_url, sync_url
from postjob_sa.errors import InvalidArgument

if TYPE_CHECKING:  # the ORM and the schema check load with the commands that use them
    from sqlalchemy.orm import Session

log = logging.getLogger("postjob_sa.cli")

_URL_PASSWORD = re.compile(r"(://[^:/@\s]*):[^@\s]*@")
CONNECT_TIMEOUT = 5


def parse_url(raw: str) -> URL:
    """The URL as the application would take it: the same driver, whichever SQLAlchemy means by
    a bare ``postgresql://`` (psycopg 3 from SQLAlchemy 2.1 on); an async application's URL
    (asyncpg, psycopg 3's async form) means the same database through psycopg 3, as
    AsyncJobQueue's worker connects; another driver is refused."""
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise InvalidArgument(f"not a database URL: {redact_text(raw)!r}") from None
    url = sync_url(url)
    check_url(url)
    return url


def redact_text(text: str, secrets: tuple[str, ...] = ()) -> str:
    """The text with URL passwords and the given secrets masked."""
    out = _URL_PASSWORD.sub(r"\1:***@", text)
    for secret in secrets:
        if secret:
            out = out.replace(secret, "***")
    return out


@dataclass
class App:
    """Per-invocation state: where the database is, created lazily."""

    explicit_url: str | None = None
    verbose: int = 0
    _url: URL | None = None
    source: str = ""
    _engine: Engine | None = field(default=None, repr=False)

    def raw_url(self) -> tuple[str, str]:
        if self.explicit_url:
            return self.explicit_url, "--database-url"
        for var in ("POSTJOB_DATABASE_URL", "DATABASE_URL"):
            value = os.environ.get(var)
            if value:
                return value, var
        from postjob_sa import embedded

        return embedded.database_url(), "embedded server"

    @property
    def url(self) -> URL:
        if self._url is None:
            raw, self.source = self.raw_url()
            self._url = parse_url(raw)
            if self.verbose and is_async_url(make_url(raw)):
                log.info("%s is an async URL (%s): the CLI connects with psycopg 3 (%s://), as "
                         "AsyncJobQueue's worker does", self.source, make_url(raw).drivername,
                         SYNC_DRIVERNAME)
        return self._url

    def url_with_password(self) -> str:
        """For child processes only (passed in their environment, never printed)."""
        return self.url.render_as_string(hide_password=False)

    def display_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    def secrets(self) -> tuple[str, ...]:
        if self._url is None or not self._url.password:
            return ()
        return (str(self._url.password),)

    def redact(self, text: str) -> str:
        return redact_text(text, self.secrets())

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = create_engine(
                self.url,
                connect_args={"connect_timeout": CONNECT_TIMEOUT, "application_name": "postjob"},
            )
        return self._engine

    def connect_checked(self) -> Connection:
        """A connection to a database whose postjob schema is current (else SchemaError)."""
        from postjob_sa._migrations import check_schema

        conn = self.engine.connect()
        try:
            check_schema(conn)
            conn.rollback()
        except BaseException:
            conn.close()
            raise
        return conn

    def session(self) -> Session:
        """A Session on a checked schema (the caller commits)."""
        from sqlalchemy.orm import Session

        with self.connect_checked():
            pass
        return Session(self.engine)

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
