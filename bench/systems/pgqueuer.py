"""pgqueuer: QueueManager over one asyncpg connection (AsyncpgDriver).

Schema: `Queries.install()` (what `pgq install` runs; durable tables). Jobs: one
async no-op entrypoint whose payload is the key. Drain:
`QueueManager.run(batch_size=b, mode=QueueExecutionMode.drain)`. Listening: the
default continuous mode, woken by pgqueuer's NOTIFY trigger, stopped through
`qm.shutdown`. Done state: pgqueuer deletes finished jobs from `pgqueuer` and
logs them as 'successful' in `pgqueuer_log`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from bench.harness import pg
from bench.systems._aio import LoopProducer, Send, timed_loop
from bench.systems.base import DrainCheck, EnqueueVariant, Options, System, WorkerConfig

if TYPE_CHECKING:
    from bench.harness.gate import Gate

ENTRYPOINT = "bench_noop"


async def _connect(url: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(url)
    return conn, Queries(AsyncpgDriver(conn))


def _payloads(keys: Sequence[int]) -> list[bytes]:
    return [str(k).encode() for k in keys]


def _enqueue_singly(url: str, keys: Sequence[int]) -> float:
    async def go() -> float:
        conn, q = await _connect(url)
        try:
            await q.enqueue(ENTRYPOINT, b"-1")  # untimed: fills asyncpg's statement cache
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
            items: list[object] = list(_payloads(keys))
            return await timed_loop(items, lambda p: q.enqueue(ENTRYPOINT, p))
        finally:
            await conn.close()

    return asyncio.run(go())


def _enqueue_batched(url: str, keys: Sequence[int], batch: int) -> float:
    async def go() -> float:
        conn, q = await _connect(url)
        try:
            payloads = _payloads(keys)
            chunks: list[object] = [payloads[i : i + batch] for i in range(0, len(payloads), batch)]

            def send(chunk: Any) -> Any:
                return q.enqueue([ENTRYPOINT] * len(chunk), chunk, [0] * len(chunk))

            return await timed_loop(chunks, send)
        finally:
            await conn.close()

    return asyncio.run(go())


class PgQueuer(System):
    name = "pgqueuer"
    requires = ("pgqueuer", "asyncpg")
    distributions = ("pgqueuer", "asyncpg")

    def setup(self, url: str) -> None:
        async def go() -> None:
            conn, q = await _connect(url)
            try:
                await q.install()
            finally:
                await conn.close()

        asyncio.run(go())

    def tables(self, url: str) -> list[str]:
        return pg.tables_like(url, "pgqueuer")

    def reset(self, url: str) -> None:
        pg.execute(url, f"TRUNCATE {', '.join(self.tables(url))} RESTART IDENTITY")

    def job_count(self, url: str) -> int:
        return int(pg.value(url, "SELECT count(*) FROM pgqueuer"))

    def enqueue_variants(self, opts: Options) -> list[EnqueueVariant]:
        return [EnqueueVariant("api", one_per_txn=_enqueue_singly, batched=_enqueue_batched)]

    def worker_configs(self, opts: Options) -> list[WorkerConfig]:
        return [WorkerConfig(f"batch={b}", {"batch_size": b}) for b in opts.pgqueuer_batch]

    def prefill(self, url: str, keys: Sequence[int]) -> None:
        _enqueue_batched(url, keys, 1000)

    def work(self, url: str, config: WorkerConfig, gate: Gate) -> None:
        asyncio.run(self._work(url, int(config.params["batch_size"]), gate))

    async def _work(self, url: str, batch_size: int, gate: Gate) -> None:
        from pgqueuer import Job, QueueManager
        from pgqueuer.types import QueueExecutionMode

        conn, q = await _connect(url)
        qm = QueueManager(q)

        @qm.entrypoint(ENTRYPOINT)
        async def bench_noop(job: Job) -> None:
            if gate.listening:
                gate.job_started(int(job.payload or b"0"))

        await gate.arrive_async()
        if gate.listening:
            runner = asyncio.create_task(qm.run(batch_size=batch_size))
            await gate.until_stop()
            qm.shutdown.set()
            await runner
        else:
            await qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
        gate.ran()
        await conn.close()

    def verify_drain(self, url: str, jobs: int) -> DrainCheck:
        left = int(pg.value(url, "SELECT count(*) FROM pgqueuer"))
        done = self.done_count(url)
        return DrainCheck(done == jobs and left == 0, {"successful": done, "left_in_queue": left})

    def done_count(self, url: str) -> int:
        return int(
            pg.value(
                url,
                "SELECT count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'",
            )
        )

    def open_producer(self, url: str) -> LoopProducer:
        @contextlib.asynccontextmanager
        async def opener() -> AsyncIterator[Send]:
            conn, q = await _connect(url)
            try:
                yield lambda key: q.enqueue(ENTRYPOINT, str(key).encode())
            finally:
                await conn.close()

        return LoopProducer(opener)
