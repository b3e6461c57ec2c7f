"""A steady stream of jobs, enqueued through whichever postjob_sa is first on the path (the
released code or this one), as an application of that code enqueues them:

    python -m tests.reliability.rolling_enqueuer URL FIRST LAST INTERVAL

Keys FIRST..LAST-1, one job per transaction, INTERVAL seconds apart: every fifth key is a
``rel.parent`` (which spawns a child and waits for it), the others are ``rel.record``. Prints
the file postjob_sa was imported from, so the caller can check which code enqueued."""

from __future__ import annotations

import sys
import time

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import postjob_sa

PARENT_EVERY = 5
PARENT_SLEEP = 0.05


def is_parent(key: int) -> bool:
    return key % PARENT_EVERY == 0


def main(url: str, first: int, last: int, interval: float) -> None:
    engine = create_engine(url)
    try:
        for key in range(first, last):
            with Session(engine) as session:
                queue = postjob_sa.JobQueue(session)
                if is_parent(key):
                    queue.enqueue("rel.parent", key, PARENT_SLEEP)
                else:
                    queue.enqueue("rel.record", key)
                session.commit()
            time.sleep(interval)
    finally:
        engine.dispose()
    print(postjob_sa.__file__)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
