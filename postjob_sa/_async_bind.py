"""An async engine or URL given to a synchronous call (:func:`postjob_sa.migrate`): the work
runs on a connection of its own, in an event loop of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from sqlalchemy import URL, Connection, Engine, make_url
from sqlalchemy.pool import NullPool

from postjob_sa.errors import InvalidArgument

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


def is_async(bind: object) -> bool:
    """Whether ``bind`` is an AsyncEngine or the URL of an async driver
    (``postgresql+asyncpg://``). An AsyncConnection is refused: it belongs to the caller's loop."""
    if isinstance(bind, Engine | Connection):
        return False
    if isinstance(bind, str | URL):
        return bool(make_url(bind).get_dialect().is_async)
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    if isinstance(bind, AsyncConnection):
        raise InvalidArgument(
            "an AsyncConnection is not a bind for a synchronous call: "
            "await conn.run_sync(postjob_sa.migrate) instead")
    return isinstance(bind, AsyncEngine)


def _own_engine(bind: AsyncEngine | str | URL) -> AsyncEngine:
    from sqlalchemy.ext.asyncio import create_async_engine

    if isinstance(bind, str | URL):
        return create_async_engine(bind, poolclass=NullPool)
    # the app's engine (its URL, its connect arguments and pool events) with a pool of its
    # own: the app's pooled connections belong to the app's event loop, ours to ours
    return create_async_engine(bind.url, pool=bind.sync_engine.pool.recreate())


def run_on_connection(bind: AsyncEngine | str | URL, work: Callable[[Connection], None]) -> None:
    """``work(connection)`` on a connection of an async ``bind``, then commit. Called inside
    a running event loop (an app's startup), it runs in a thread of its own, with a loop of
    its own, and blocks until done."""

    async def run() -> None:
        engine = _own_engine(bind)
        try:
            async with engine.connect() as conn:
                await conn.run_sync(work)
                await conn.commit()
        finally:
            await engine.dispose()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(run())
        return
    with ThreadPoolExecutor(1, thread_name_prefix="postjob-migrate") as pool:
        pool.submit(asyncio.run, run()).result()
