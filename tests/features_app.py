"""Workflows of the feature tests that run real worker processes
(``--import tests.features_app``)."""

from __future__ import annotations

import os
import time

import psycopg

import postjob_sa


@postjob_sa.workflow(name="fx.slow")
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@postjob_sa.workflow(name="fx.after_queue")
def after_queue(queue: str, then_sleep: float) -> str:
    """Wait until every job of ``queue`` is ok (on a connection of its own, ``$REL_APP_URL``),
    then sleep: a job that can only end after the other queue's jobs did."""
    deadline = time.monotonic() + 120
    with psycopg.connect(os.environ["REL_APP_URL"], autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM postjob.jobs WHERE queue = %s "
                           "AND status <> 'ok'", [queue]).fetchone() != (0,):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the jobs of queue {queue!r} did not end")
            time.sleep(0.02)
    time.sleep(then_sleep)
    return queue
