"""One database URL for an async application and postjob's sync connections.

An application on ``AsyncJobQueue`` has an async URL (``postgresql+asyncpg://`` or
``postgresql+psycopg_async://``). Its worker, the CLI and the dashboard take that URL as it is
and connect to the same database with psycopg 3 (``postgresql+psycopg://``): asyncpg's
``ssl=`` setting becomes libpq's ``sslmode=``, and the settings only asyncpg knows are left
out. Imports no driver.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

#: The async URL forms of AsyncJobQueue's drivers, as SQLAlchemy spells them after the ``+``.
ASYNC_URL_DRIVERS = ("asyncpg", "psycopg_async")
#: What every such URL becomes.
SYNC_DRIVERNAME = "postgresql+psycopg"
#: asyncpg's ``ssl=`` modes, which libpq's ``sslmode=`` takes too.
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: Query settings of SQLAlchemy's asyncpg dialect and asyncpg's connect(), unknown to libpq.
_ASYNCPG_ONLY = ("prepared_statement_cache_size", "prepared_statement_name_func",
                 "statement_cache_size", "max_cached_statement_lifetime",
                 "max_cacheable_statement_size", "command_timeout", "timeout")


def is_async_url(url: URL) -> bool:
    """Whether ``url`` is the async form of a driver AsyncJobQueue runs on."""
    return url.get_backend_name() == "postgresql" and url.get_driver_name() in ASYNC_URL_DRIVERS


def sync_url(url: URL) -> URL:
    """``url`` as psycopg 3 connects to the same database when it is an async URL of
    AsyncJobQueue's drivers (see the module docstring); any other URL as it is."""
    if not is_async_url(url):
        return url
    query = dict(url.query)
    if url.get_driver_name() == "asyncpg":
        for name in _ASYNCPG_ONLY:
            query.pop(name, None)
        if query.get("ssl") in _SSL_MODES and "sslmode" not in query:
            query["sslmode"] = query.pop("ssl")  # another value stays: libpq names it
    return url.set(drivername=SYNC_DRIVERNAME, query=query)
