"""Helpers for systems whose client API is asyncio-based."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack

from bench.harness.measure import now

Send = Callable[[int], Awaitable[object]]


class LoopProducer:
    """A synchronous Producer over an async enqueue call, on a private event loop.

    The timestamps are taken inside the coroutine, around the awaited enqueue,
    so driving the loop from sync code adds nothing to the measured interval.
    """

    def __init__(self, opener: Callable[[], AbstractAsyncContextManager[Send]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._stack = AsyncExitStack()
        self._send = self._loop.run_until_complete(self._stack.enter_async_context(opener()))

    async def _timed(self, key: int) -> tuple[float, float]:
        t_call = now()
        await self._send(key)
        return t_call, now()

    def enqueue(self, key: int) -> tuple[float, float]:
        return self._loop.run_until_complete(self._timed(key))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._stack.aclose())
        finally:
            self._loop.close()


async def timed_loop(items: list[object], send: Callable[[object], Awaitable[object]]) -> float:
    """Await send(item) for each item in order; return the elapsed seconds."""
    t0 = now()
    for item in items:
        await send(item)
    return now() - t0
