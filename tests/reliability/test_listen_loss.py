"""The worker's LISTEN connection (its own, which it also checks out with) is killed
(pg_terminate_backend) under a steady stream of jobs: the worker reconnects, LISTENs again,
keeps taking jobs, and wake-ups stay fast. The supervisor's relay, its LISTEN killed, listens
again and wakes an idle child (a job may have come while nobody listened)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from postjob_sa.cli._relay import Relay
from postjob_sa.worker.wakeup import IDLE, WAKE
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for, wait_listening

pytestmark = pytest.mark.both_drivers

PERIOD = 0.02  # one job every 20 ms
DURATION = 4.0
KILLS = (1.0, 2.0, 3.0)  # seconds into the stream
LISTEN_PIDS = text(
    "SELECT pid FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE 'postjob worker %'"
)


def _listen_pids(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(LISTEN_PIDS)}


def test_worker_keeps_working_and_relistens_when_listen_is_killed(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    # one worker: no other process could pick its jobs up; a short lease, in case a kill lands
    # between a checkout's commit and its reply (the job is then rescued as a zombie)
    proc = workers(db_url, "--lease", "2")
    wait_listening(engine, 1, [proc])

    committed: dict[int, float] = {}
    failures: list[BaseException] = []

    def enqueue() -> None:
        try:
            with Session(engine) as s:
                q = JobQueue(s)
                start = time.monotonic()
                n = 0
                while time.monotonic() - start < DURATION:
                    job = q.enqueue("rel.stamp", n)
                    s.commit()
                    committed[job.id] = time.clock_gettime(time.CLOCK_MONOTONIC)
                    n += 1
                    time.sleep(max(0.0, start + n * PERIOD - time.monotonic()))
        except BaseException as exc:
            failures.append(exc)

    feeder = threading.Thread(target=enqueue)
    t0 = time.monotonic()
    feeder.start()
    relisten: list[float] = []
    try:
        for at in KILLS:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            old = _listen_pids(engine)
            assert len(old) == 1, old
            with engine.begin() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": next(iter(old))})
            killed = time.monotonic()
            wait_for(lambda old=old: (p := _listen_pids(engine)) and p != old, 5,
                     "the worker LISTENs again", interval=0.005)
            relisten.append(time.monotonic() - killed)
    finally:
        feeder.join(timeout=DURATION + 10)
    assert not failures, failures
    total = len(committed)
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'")
             == total, 10, f"all {total} jobs ok")

    with engine.connect() as conn:
        started = {r[0]: float(r[1]) for r in conn.execute(
            text("SELECT job_id, what FROM rel_runs"))}
    assert set(started) == set(committed)
    latency = sorted((started[j] - committed[j]) * 1000 for j in committed)
    p50, p99, worst = latency[len(latency) // 2], latency[int(len(latency) * 0.99)], latency[-1]
    log = proc.log()
    assert log.count("reconnecting in") >= len(KILLS), log
    assert max(relisten) < 2.0, relisten
    # the worker reconnects after 0.1 s and LISTENs again: no job waits anywhere near the
    # 30 s poll cap (a job caught by a kill mid-checkout is rescued after the 2 s lease)
    assert worst < 3500, latency[-10:]
    assert proc.alive(), log
    report(f"listen loss: {len(KILLS)} kills under {1 / PERIOD:.0f} jobs/s; re-LISTEN after "
           f"{', '.join(f'{r * 1000:.0f}' for r in relisten)} ms; {total} jobs, wake-up latency "
           f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f} ms")


def test_the_relay_listens_again_and_wakes_an_idle_child(runs: Engine) -> None:
    relay = Relay(runs, poll_interval=30.0, name="postjob relay test")
    child = socket.socket(fileno=os.dup(relay.add(1)))
    relay.started(1)
    try:
        child.send(IDLE)
        relay.serve(0.2)  # listens, and counts the child idle
        assert relay.conn is not None and relay.idle == [1] and relay.wakes == 0
        with runs.begin() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'postjob relay test'"))
        deadline = time.monotonic() + 10
        while relay.wakes == 0 and time.monotonic() < deadline:
            relay.serve(0.1)  # notices the loss, then listens again after a pause
        assert relay.conn is not None and relay.wakes == 1
        child.settimeout(1.0)
        assert child.recv(1) == WAKE
    finally:
        child.close()
        relay.close()
