"""Prometheus metrics (a host's registry, ``postjob run --metrics-port``, one or several
processes), the library's absence, and the structured fields of job log lines."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, _hot_tables
from postjob_sa.cli._logging import JsonFormatter
from postjob_sa.errors import InvalidArgument
from postjob_sa.metrics import PostjobCollector
from postjob_sa.registry import Registry
from tests.conftest import url_string
from tests.pgbouncer import free_port
from tests.reliability.conftest import POSTJOB, wait_for

registry = Registry()
failed_once: set[int] = set()


@postjob_sa.workflow(name="met.ok", registry=registry)
def ok(value: int) -> int:
    return value


@postjob_sa.workflow(name="met.flaky", registry=registry)
def flaky(value: int) -> int:
    job = postjob_sa.current_job().id
    if job not in failed_once:
        failed_once.add(job)
        raise RuntimeError("first attempt fails")
    return value


@postjob_sa.workflow(name="met.approval", registry=registry)
def approval(value: int) -> object:
    return postjob_sa.manual("approve", value).result()


@postjob_sa.workflow(name="met.tx", registry=registry, transactional=True)
def tx(session: Session, value: int) -> int:
    return value


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


def _enqueue(session: Session, workflow: str, *values: int, queue: str | None = None) -> None:
    q = JobQueue(session)
    for v in values:
        q.enqueue(workflow, v, queue=queue)
    session.commit()


def test_a_host_registers_the_collector_in_its_own_registry(session: Session) -> None:
    reg = CollectorRegistry()
    collector = PostjobCollector(session.get_bind(), interval=3600)  # type: ignore[arg-type]
    reg.register(collector)
    try:
        before = {k: _value(reg, "postjob_jobs_finished_total", workflow="met.ok", outcome=k)
                  for k in ("ok", "err")}
        enq = _value(reg, "postjob_jobs_enqueued_total", workflow="met.ok", queue="mq")
        runs = _value(reg, "postjob_job_duration_seconds_count", workflow="met.ok")
        _enqueue(session, "met.ok", 1, 2, 3, queue="mq")
        _enqueue(session, "nobody.runs.this", 1, 2, queue="waiting")
        assert _value(reg, "postjob_jobs_enqueued_total", workflow="met.ok", queue="mq") == enq + 3
        assert JobQueue(session, fast_mode=True, registry=registry).drain() == 3
        assert _value(reg, "postjob_jobs_finished_total", workflow="met.ok",
                      outcome="ok") == before["ok"] + 3
        assert _value(reg, "postjob_job_duration_seconds_count", workflow="met.ok") == runs + 3
        # the queue gauges come from the last sample, never from a query per scrape
        assert _value(reg, "postjob_queue_waiting", queue="waiting") in (0.0, 2.0)
        collector.refresh()
        assert _value(reg, "postjob_queue_waiting", queue="waiting") == 2
        assert _value(reg, "postjob_queue_oldest_waiting_seconds", queue="waiting") >= 0
        assert _value(reg, "postjob_queue_sampled_timestamp_seconds") > 0
    finally:
        collector.close()


def test_manual_steps_are_counted_apart_never_as_waiting_work(session: Session) -> None:
    """Issue 24 item 13: a step waiting for a person's token is not work a worker could do,
    so the alert on waiting work does not fire for a pending approval."""
    reg = CollectorRegistry()
    collector = PostjobCollector(session.get_bind(), interval=3600)  # type: ignore[arg-type]
    reg.register(collector)
    try:
        _enqueue(session, "met.approval", 1, queue="approvals")
        JobQueue(session, fast_mode=True, registry=registry).drain()
        collector.refresh()
        assert _value(reg, "postjob_queue_waiting", queue="approvals") == 0
        assert _value(reg, "postjob_queue_oldest_waiting_seconds", queue="approvals") == 0
        assert _value(reg, "postjob_queue_manual_steps", queue="approvals") == 1
    finally:
        collector.close()


def test_the_hot_tables_dead_rows_and_bytes_are_sampled(session: Session) -> None:
    """Issue 34: each hot table's dead rows, and the bytes of each hot table, of each of its
    indexes and of the job record, from the same sample as the queues."""
    reg = CollectorRegistry()
    collector = PostjobCollector(session.get_bind(), interval=3600)  # type: ignore[arg-type]
    reg.register(collector)
    try:
        JobQueue(session).set_queue_limits("hot", concurrency=5, rate=1000)  # places and starts
        _enqueue(session, "met.ok", *range(50), queue="hot")
        JobQueue(session, fast_mode=True, registry=registry).drain()
        collector.refresh()
        for table in _hot_tables.HOT_TABLES:
            assert reg.get_sample_value("postjob_hot_table_dead_tuples", {"table": table}) \
                is not None, table
            assert _value(reg, "postjob_hot_relation_bytes", relation=table, table=table) > 0
        first = "postjob.postjobs_from_0"  # the record's first range, where its jobs are
        assert _value(reg, "postjob_hot_relation_bytes", relation=first, table=first) > 0
        assert _value(reg, "postjob_history_partitions") == 2  # and the default partition
        assert _value(reg, "postjob_history_bytes") > _value(
            reg, "postjob_hot_relation_bytes", relation=first, table=first)
        indexes = [s for m in reg.collect() if m.name == "postjob_hot_relation_bytes"
                   for s in m.samples if s.labels["relation"] != s.labels["table"]]
        assert {s.labels["table"] for s in indexes} == set(_hot_tables.HOT_TABLES), indexes
    finally:
        collector.close()


def test_without_prometheus_client_the_hooks_do_nothing_and_the_collector_says_why() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from postjob_sa import _metrics\n"
        "from postjob_sa.metrics import PostjobCollector\n"
        "_metrics.enqueued('w', 'q'); _metrics.finished('w', 'ok', 0.1); _metrics.woken('poll')\n"
        "assert _metrics.ALL == []\n"
        "try:\n"
        "    PostjobCollector()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("InvalidArgument") and "postjob_sa[metrics]" in out.stdout


def test_collector_options_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="interval"):
        PostjobCollector(interval=0)


def test_job_log_lines_carry_job_id_workflow_attempt_and_duration(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    _enqueue(session, "met.flaky", 7)
    _enqueue(session, "met.tx", 8)
    with caplog.at_level(logging.INFO, logger="postjob_sa.worker"):
        queue = JobQueue(session, fast_mode=True, registry=registry)
        wait_for(lambda: queue.drain() == 0 and not _unfinished(session), 10, "both jobs done")
    lines = [r for r in caplog.records if getattr(r, "job_id", None) is not None
             and "traceback" not in r.getMessage()]
    flaky_lines = [(r.outcome, r.attempt) for r in lines if r.workflow == "met.flaky"]  # type: ignore[attr-defined]
    assert flaky_lines == [("err", 1), ("ok", 2)]
    assert [(r.outcome, r.attempt) for r in lines if r.workflow == "met.tx"] == [("ok", 1)]  # type: ignore[attr-defined]
    assert all(isinstance(r.duration, float) for r in lines)  # type: ignore[attr-defined]


def _unfinished(session: Session) -> int:
    return int(session.execute(text(
        "SELECT count(*) FROM postjob.jobs WHERE status <> 'ok'")).scalar_one())


def test_the_json_log_format_carries_the_job_fields() -> None:
    record = logging.LogRecord("postjob_sa.worker", logging.INFO, __file__, 1,
                               "job %s (w): ok in 1.0 ms", (5,), None)
    record.__dict__.update(job_id=5, workflow="w", attempt=2, duration=0.001, outcome="ok",
                           status="ok")
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job 5 (w): ok in 1.0 ms" and line["level"] == "INFO"
    assert {k: line[k] for k in ("job_id", "workflow", "attempt", "duration")} == {
        "job_id": 5, "workflow": "w", "attempt": 2, "duration": 0.001}


# -- postjob run --metrics-port ----------------------------------------------------------------


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _finished_ok(port: int) -> float:
    try:
        text_ = _scrape(port)
    except OSError:
        return -1.0
    total = 0.0
    for line in text_.splitlines():
        if line.startswith('postjob_jobs_finished_total{') and 'workflow="demo.measure"' in line \
                and 'outcome="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("processes", [1, 2])
def test_postjob_run_serves_metrics(db_url: URL, engine: Engine, clean: None,
                                    processes: int) -> None:
    port = free_port()
    argv = [POSTJOB, "--database-url", url_string(db_url), "run", "--import", "postjob_sa.demo",
            "--metrics-port", str(port), "--processes", str(processes), "--log-format", "json",
            "-v"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: _finished_ok(port) == 0 or proc.poll() is not None, 20, "metrics served")
        assert proc.poll() is None
        with engine.begin() as conn:
            for word in ("a", "bb", "ccc", "dddd"):
                conn.execute(text("INSERT INTO postjob.postjobs (workflow, args) VALUES "
                                  "('demo.measure', CAST(:a AS jsonb))"), {"a": json.dumps([word])})
        wait_for(lambda: _finished_ok(port) == 4, 20, "four jobs counted")
        scraped = _scrape(port)
        assert "postjob_job_duration_seconds_bucket" in scraped
        assert "postjob_queue_sampled_timestamp_seconds" in scraped
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    jobs = [json.loads(line) for line in stderr.splitlines()
            if line.startswith("{") and '"job_id"' in line]
    assert sorted(j["job_id"] for j in jobs) == [1, 2, 3, 4], stderr
    assert {j["attempt"] for j in jobs} == {1} and {j["workflow"] for j in jobs} == {"demo.measure"}


def test_metrics_port_in_use_is_one_line(db_url: URL, clean: None) -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))
        s.listen()
        res = subprocess.run([POSTJOB, "--database-url", url_string(db_url), "run", "--import",
                              "postjob_sa.demo", "--metrics-port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("postjob: cannot serve metrics on port")

