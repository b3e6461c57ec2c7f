"""What ``postjob run`` adds for many workers: the supervisor's wake-up relay and the metrics
served over HTTP."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from postjob_sa._db import worker_identifier
from postjob_sa.errors import InvalidArgument
from postjob_sa.metrics import PostjobCollector, serve

from ._env import CONNECT_TIMEOUT, App, parse_url
from ._relay import Relay

log = logging.getLogger("postjob_sa.cli")

#: The environment variable of prometheus-client's multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def wakeup_engine(app: App, pooled: bool, wakeup_url: str | None) -> Engine | None:
    """The engine of the direct connection to LISTEN on: ``--wakeup-url``, else the database
    URL unless it goes through a pooler (None: nothing to listen on)."""
    if wakeup_url is not None:
        url = parse_url(wakeup_url)
    elif pooled:
        return None
    else:
        url = app.url
    return create_engine(url, poolclass=NullPool, connect_args={
        "connect_timeout": CONNECT_TIMEOUT, "application_name": "postjob supervisor"})


def relay_for(app: App, pooled: bool, wakeup_url: str | None, poll_interval: float) -> Relay:
    engine = wakeup_engine(app, pooled, wakeup_url)
    if engine is None:
        log.info("no --wakeup-url: the supervisor wakes one idle worker every %gs", poll_interval)
    return Relay(engine, poll_interval=poll_interval,
                 name=f"postjob supervisor {worker_identifier()}")


@contextmanager
def metrics_served(port: int | None, engine: Engine, processes: int) -> Iterator[dict[str, str]]:
    """Serve the metrics on ``port`` while the workers run; yields the environment the worker
    processes need (under a supervisor they count into files the supervisor serves)."""
    if port is None:
        yield {}
        return
    shared = tempfile.mkdtemp(prefix="postjob-metrics-") if processes > 1 else None
    collector = PostjobCollector(engine, process=shared is None)
    try:
        server = serve(port, collector, multiprocess_dir=shared)
    except OSError as exc:
        collector.close()
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
        raise InvalidArgument(f"cannot serve metrics on port {port}: {exc.strerror or exc}") from None
    log.info("metrics on http://0.0.0.0:%d/metrics", port)
    try:
        yield {} if shared is None else {MULTIPROC_ENV: shared}
    finally:
        server.shutdown()
        collector.close()
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
