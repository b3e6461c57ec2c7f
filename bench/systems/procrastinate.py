"""procrastinate: async App + PsycopgConnector (psycopg 3 with psycopg_pool).

Schema: `app.schema_manager.apply_schema_async()` (what `procrastinate schema
--apply` runs). Jobs: one async no-op task. Drain: `run_worker_async(wait=False)`,
which returns once a fetch finds no job. Listening: the default `wait=True`
(LISTEN/NOTIFY on), cancelled when the driver says stop. Done state:
`procrastinate_jobs.status = 'succeeded'`.
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

TASK = "bench_noop"


def _app(url: str, gate: Gate | None = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name=TASK)
    async def bench_noop(key: int) -> None:
        if gate is not None:
            gate.job_started(key)

    return app


async def _warm_then_clear(app: Any) -> None:
    """One untimed defer (opens pool connections), then remove it."""
    await app.tasks[TASK].defer_async(key=-1)
    await app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")


def _enqueue_singly(url: str, keys: Sequence[int]) -> float:
    async def go() -> float:
        app = _app(url)
        async with app.open_async():
            await _warm_then_clear(app)
            task = app.tasks[TASK]
            return await timed_loop(list(keys), lambda k: task.defer_async(key=k))

    return asyncio.run(go())


def _enqueue_batched(url: str, keys: Sequence[int], batch: int) -> float:
    async def go() -> float:
        app = _app(url)
        async with app.open_async():
            await _warm_then_clear(app)
            task = app.tasks[TASK]
            chunks: list[object] = [
                [{"key": k} for k in keys[i : i + batch]] for i in range(0, len(keys), batch)
            ]
            return await timed_loop(chunks, lambda c: task.batch_defer_async(*c))

    return asyncio.run(go())


class Procrastinate(System):
    name = "procrastinate"
    requires = ("procrastinate", "psycopg", "psycopg_pool")
    distributions = ("procrastinate", "psycopg", "psycopg-binary", "psycopg-pool")

    def setup(self, url: str) -> None:
        async def go() -> None:
            app = _app(url)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(go())

    def tables(self, url: str) -> list[str]:
        return pg.tables_like(url, "procrastinate_")

    def reset(self, url: str) -> None:
        pg.execute(url, f"TRUNCATE {', '.join(self.tables(url))} RESTART IDENTITY CASCADE")

    def job_count(self, url: str) -> int:
        return int(pg.value(url, "SELECT count(*) FROM procrastinate_jobs"))

    def enqueue_variants(self, opts: Options) -> list[EnqueueVariant]:
        return [EnqueueVariant("api", one_per_txn=_enqueue_singly, batched=_enqueue_batched)]

    def worker_configs(self, opts: Options) -> list[WorkerConfig]:
        return [WorkerConfig(f"c={c}", {"concurrency": c}) for c in opts.procrastinate_concurrency]

    def prefill(self, url: str, keys: Sequence[int]) -> None:
        _enqueue_batched(url, keys, 1000)

    def work(self, url: str, config: WorkerConfig, gate: Gate) -> None:
        asyncio.run(self._work(url, int(config.params["concurrency"]), gate))

    async def _work(self, url: str, concurrency: int, gate: Gate) -> None:
        app = _app(url, gate)
        async with app.open_async():
            await gate.arrive_async()
            if gate.listening:
                runner = asyncio.create_task(
                    app.run_worker_async(
                        concurrency=concurrency, wait=True, install_signal_handlers=False
                    )
                )
                await gate.until_stop()
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            else:
                await app.run_worker_async(
                    concurrency=concurrency, wait=False, install_signal_handlers=False
                )
            gate.ran()

    def verify_drain(self, url: str, jobs: int) -> DrainCheck:
        counts = dict(
            pg.execute(url, "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1")
        )
        ok = counts.get("succeeded", 0) == jobs and sum(counts.values()) == jobs
        return DrainCheck(ok, counts)

    def done_count(self, url: str) -> int:
        return int(
            pg.value(url, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        )

    def open_producer(self, url: str) -> LoopProducer:
        @contextlib.asynccontextmanager
        async def opener() -> AsyncIterator[Send]:
            app = _app(url)
            async with app.open_async():
                task = app.tasks[TASK]
                yield lambda key: task.defer_async(key=key)

        return LoopProducer(opener)
