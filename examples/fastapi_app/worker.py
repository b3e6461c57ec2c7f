"""The worker, a management command of the app:

    python -m examples.fastapi_app.worker           # run jobs until SIGINT/SIGTERM
    python -m examples.fastapi_app.worker --drain   # run what is due now, then exit (cron)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from examples.fastapi_app import workflows  # noqa: F401  (registers the app's workflows)
from examples.fastapi_app.config import async_url, database_url
from postjob_sa import AsyncJobQueue


async def run(drain: bool) -> int:
    engine = create_async_engine(async_url(database_url()))
    try:
        async with AsyncSession(engine) as session:
            # up to 20 jobs at once: async workflows are tasks on the worker's event loop
            queue = AsyncJobQueue(session, concurrency=20)
            return await (queue.drain() if drain else queue.work())
    finally:
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the app's postjob_sa jobs.")
    parser.add_argument("--drain", action="store_true", help="exit when no job is due")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    ran = asyncio.run(run(opts.drain))
    logging.info("ran %d jobs", ran)
    return ran


if __name__ == "__main__":
    main()
