"""Tracing with OpenTelemetry's SDK and its in-memory exporter: an enqueue inside a span stores
its trace context, each run of the job is a span in that trace (with the workflow, job id,
attempt, queue and outcome), and a parent's re-runs and its children are in the root job's
trace. Without a tracer provider nothing is stored and no span is made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import Job, JobQueue, _tracing
from tests.durable import durable_app
from tests.durable.conftest import job


def _reset_provider() -> None:
    """What opentelemetry's own test helpers do: the global provider may be set again."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    _reset_provider()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    yield spans
    provider.shutdown()
    _reset_provider()


def _drain(engine: Engine) -> None:
    with Session(engine) as s:
        JobQueue(s, fast_mode=True).drain()


def test_a_job_tree_is_one_trace(side: Engine, exporter: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("the app")
    with tracer.start_as_current_span("POST /orders") as request, Session(side) as s:
        parent = JobQueue(s).enqueue(durable_app.charge_once, 2).id
        s.commit()
    _drain(side)
    assert job(side, parent)["status"] == "ok"
    stored = job(side, parent)["trace_context"]
    trace_id = request.get_span_context().trace_id
    assert stored["traceparent"].split("-")[1] == f"{trace_id:032x}"
    with side.connect() as conn:
        children = [r[0] for r in conn.execute(text(
            "SELECT trace_context FROM postjob.jobs WHERE parent_id = :p"), {"p": parent})]
    assert children == [stored, stored]  # a child is in its parent's trace

    runs = [s for s in exporter.get_finished_spans() if s.name.startswith("run ")]
    assert {s.context.trace_id for s in runs} == {trace_id}
    assert all(s.parent is not None and s.parent.span_id == request.get_span_context().span_id
               for s in runs)
    parents = [s for s in runs if s.attributes["postjob.workflow"] == "dur.charge_once"]
    assert [s.attributes["postjob.outcome"] for s in parents] == ["sleep", "sleep", "ok"]
    first: dict[str, Any] = dict(parents[0].attributes)
    assert first == {"postjob.workflow": "dur.charge_once", "postjob.job_id": parent,
                     "postjob.attempt": 1, "postjob.queue": "q", "postjob.root_id": parent,
                     "postjob.outcome": "sleep"}
    assert len([s for s in runs if s.attributes["postjob.workflow"] == "dur.child"]) == 2


def test_a_failed_run_is_an_error_span_and_spans_nest_in_the_run(
    side: Engine, exporter: InMemorySpanExporter
) -> None:
    with trace.get_tracer("t").start_as_current_span("enqueue"), Session(side) as s:
        job_id = JobQueue(s).enqueue(durable_app.twice).id
        s.add(Job(workflow="dur.child", args=[1]))  # the model's default traces it too
        s.commit()
    _drain(side)
    (failed,) = [s for s in exporter.get_finished_spans()
                 if s.attributes.get("postjob.job_id") == job_id]
    assert failed.attributes["postjob.outcome"] == "failed"
    assert failed.status.status_code is trace.StatusCode.ERROR
    with side.connect() as conn:
        traced = conn.execute(text("SELECT count(*) FROM postjob.jobs "
                                   "WHERE trace_context IS NOT NULL")).scalar_one()
    assert traced == 2


def test_without_a_tracer_provider_nothing_is_traced(side: Engine) -> None:
    _reset_provider()
    assert not _tracing.enabled()
    with trace.get_tracer("t").start_as_current_span("x"), Session(side) as s:
        job_id = JobQueue(s).enqueue(durable_app.with_args, 1).id
        s.commit()
    _drain(side)
    assert job(side, job_id)["trace_context"] is None
