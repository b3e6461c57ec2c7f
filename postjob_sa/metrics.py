"""Prometheus metrics (the ``metrics`` extra: ``pip install 'postjob_sa[metrics]'``).

A host app registers one collector in its own registry; ``postjob run --metrics-port N``
serves the same on ``http://host:N/metrics``::

    from prometheus_client import REGISTRY
    from postjob_sa.metrics import PostjobCollector

    REGISTRY.register(PostjobCollector(engine))

The metrics, their labels and what each counts are listed in docs/operations.md.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from sqlalchemy import Engine, text

from postjob_sa import _hot_tables, _metrics
from postjob_sa.errors import InvalidArgument

log = logging.getLogger("postjob_sa.metrics")

#: Per queue: the jobs due now and how long the oldest of them has been due, the manual steps
#: waiting for their token (apart: no worker can do them), and the jobs running. It reads the
#: narrow table of unfinished work only (postjob.unfinished), never a finished job, and a
#: statement timeout bounds it on a huge backlog.
QUEUE_STATS = text(
    "SELECT queue, "
    "count(*) FILTER (WHERE workflow <> '__manual__' AND lease_token IS NULL "
    "AND run_at <= statement_timestamp()) AS waiting, "
    "COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - min(run_at) FILTER ("
    "WHERE workflow <> '__manual__' AND lease_token IS NULL "
    "AND run_at <= statement_timestamp())), 0)::float8 AS oldest, "
    "count(*) FILTER (WHERE workflow = '__manual__' AND lease_token IS NULL) AS manual, "
    "count(*) FILTER (WHERE lease_token IS NOT NULL) AS running "
    "FROM postjob.unfinished WHERE status IN ('ready', 'err', 'sleep') GROUP BY queue"
)
#: The ranges of the job record (its partitions, the default one among them) and their bytes
#: on disk, indexes included: the catalog only.
HISTORY_SIZE = text(
    "SELECT count(*) AS ranges, COALESCE(sum(pg_total_relation_size(i.inhrelid)), 0) AS bytes "
    "FROM pg_inherits i WHERE i.inhparent = 'postjob.postjobs'::regclass")
STATEMENT_TIMEOUT_SET = text("SELECT set_config('statement_timeout', :ms, true)")


class QueueStats(NamedTuple):
    """One queue as last sampled."""

    waiting: int  # due now (ready, err, or a sleep whose time has come), manual steps apart
    oldest_waiting: float  # seconds the longest-waiting of them has been due
    running: int  # processing
    manual: int = 0  # manual steps waiting for their token


def _library() -> Any:
    if _metrics.prometheus is None:
        raise InvalidArgument("Prometheus metrics need the prometheus-client library: "
                              "pip install 'postjob_sa[metrics]'")
    return _metrics.prometheus


class PostjobCollector:
    """A prometheus-client collector of postjob_sa's metrics.

    It yields this process's job counters and run-time histograms (``process=True``) and, with
    an ``engine``, the depth of each queue, the age of its oldest waiting job, and the dead
    rows and bytes of the hot tables and their indexes. Those are
    sampled by a background thread every ``interval`` seconds (one cheap query, bounded by
    ``statement_timeout`` seconds) and served from that sample: a scrape never queries the
    database. :meth:`close` stops the thread.
    """

    def __init__(self, engine: Engine | None = None, *, interval: float = 15.0,
                 process: bool = True, statement_timeout: float = 5.0):
        self._prometheus = _library()
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
            raise InvalidArgument(f"interval must be a positive number of seconds, not {interval!r}")
        self.engine = engine
        self.interval = float(interval)
        self.process = process
        self.statement_timeout = statement_timeout
        self.queues: dict[str, QueueStats] = {}
        #: the hot tables and the job record as last sampled (postjob_sa._hot_tables)
        self.tables: list[_hot_tables.Relation] = []
        #: the record's ranges and their bytes, as last sampled
        self.history: tuple[int, int] = (0, 0)
        self.sampled_at: float | None = None  # time.time() of the last sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if engine is not None:
            self._thread = threading.Thread(target=self._sample_forever, daemon=True,
                                            name="postjob-metrics")
            self._thread.start()

    def refresh(self) -> None:
        """Sample the queues now (the background thread calls this every ``interval``)."""
        if self.engine is None:
            return
        queues: dict[str, QueueStats] = {}
        with self.engine.connect() as conn:
            conn.execute(STATEMENT_TIMEOUT_SET, {"ms": str(int(self.statement_timeout * 1000))})
            for row in conn.execute(QUEUE_STATS):
                old = queues.get(row.queue, QueueStats(0, 0.0, 0))
                queues[row.queue] = QueueStats(old.waiting + int(row.waiting),
                                               max(old.oldest_waiting, float(row.oldest)),
                                               old.running + int(row.running),
                                               old.manual + int(row.manual))
            tables = _hot_tables.read(conn)  # the catalog and the statistics: cheap
            history = conn.execute(HISTORY_SIZE).one()
            conn.rollback()
        self.queues = queues
        self.tables = tables
        self.history = (int(history.ranges), int(history.bytes))
        self.sampled_at = time.time()

    def _sample_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # the last sample stays; say why once per failure
                log.warning("could not sample the queues for metrics: %s",
                            " ".join(str(exc).split())[:300])
            self._stop.wait(self.interval)

    def close(self) -> None:
        """Stop sampling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def describe(self) -> list[Any]:
        return []  # the metrics' names vary with the queues: nothing to check in advance

    def collect(self) -> Iterator[Any]:
        """The metrics, as prometheus-client asks for them on a scrape."""
        if self.process:
            for metric in _metrics.ALL:
                yield from metric.collect()
        if self.engine is None:
            return
        core = self._prometheus.metrics_core
        waiting = core.GaugeMetricFamily(
            "postjob_queue_waiting",
            "Jobs due now and not running, per queue (manual steps are counted apart).",
            labels=["queue"])
        oldest = core.GaugeMetricFamily(
            "postjob_queue_oldest_waiting_seconds",
            "How long the longest-waiting due job of each queue has been due.", labels=["queue"])
        running = core.GaugeMetricFamily(
            "postjob_queue_running", "Jobs running (processing), per queue.", labels=["queue"])
        manual = core.GaugeMetricFamily(
            "postjob_queue_manual_steps",
            "Manual steps waiting for their token, per queue (no worker can do them).",
            labels=["queue"])
        for queue, stats in sorted(self.queues.items()):
            waiting.add_metric([queue], stats.waiting)
            oldest.add_metric([queue], stats.oldest_waiting)
            running.add_metric([queue], stats.running)
            manual.add_metric([queue], stats.manual)
        dead = core.GaugeMetricFamily(
            "postjob_hot_table_dead_tuples",
            "Dead rows of each hot table (and of the job record) that VACUUM has not reclaimed.",
            labels=["table"])
        size = core.GaugeMetricFamily(
            "postjob_hot_relation_bytes",
            "Bytes of each hot table, of each of their indexes, and of the job record.",
            labels=["relation", "table"])
        for rel in self.tables:
            if not rel.is_index:
                dead.add_metric([rel.name], rel.dead_rows)
            size.add_metric([rel.name, rel.table], rel.bytes)
        ranges = core.GaugeMetricFamily(
            "postjob_history_partitions",
            "Ranges of job ids the job record is partitioned by (its default partition too).")
        ranges.add_metric([], self.history[0])
        history_bytes = core.GaugeMetricFamily(
            "postjob_history_bytes", "Bytes on disk of the job record, indexes included.")
        history_bytes.add_metric([], self.history[1])
        sampled = core.GaugeMetricFamily(
            "postjob_queue_sampled_timestamp_seconds",
            "When the queue metrics were sampled (Unix time; 0 before the first sample).")
        sampled.add_metric([], self.sampled_at or 0.0)
        yield from (waiting, oldest, running, manual, dead, size, ranges, history_bytes, sampled)


def serve(port: int, collector: PostjobCollector, *, addr: str = "0.0.0.0",
          multiprocess_dir: str | None = None) -> Any:
    """Serve ``collector`` (and, with ``multiprocess_dir``, the counters of the worker
    processes that write there) on ``http://addr:port/metrics``; returns the HTTP server
    (``shutdown()`` stops it)."""
    prometheus = _library()
    registry = prometheus.CollectorRegistry()
    if multiprocess_dir is not None:
        multiprocess = importlib.import_module("prometheus_client.multiprocess")
        multiprocess.MultiProcessCollector(registry, path=multiprocess_dir)
    registry.register(collector)
    server, _thread = prometheus.start_http_server(port, addr=addr, registry=registry)
    return server
