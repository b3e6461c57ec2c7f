"""Tracing with OpenTelemetry's SDK and its in-memory exporter: an enqueue inside a span stores
its trace context, each run of the job is a span in that trace (with the workflow, job id,
attempt, queue and outcome), and a parent's re-runs and its children are in the root job's
trace. Without a tracer provider nothing is stored and no span is made."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import Job, JobQueue, _tracing
from tests.cli.test_cli_db import postjob
from tests.conftest import url_string
from tests.durable import durable_app
from tests.durable.conftest import job

ROOT = Path(__file__).resolve().parents[2]


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


def _parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _runs(exporter: InMemorySpanExporter, job_id: int) -> list[ReadableSpan]:
    """The run spans of a job, in the order they ended."""
    return [s for s in exporter.get_finished_spans()
            if s.name.startswith("run ") and s.attributes.get("postjob.job_id") == job_id]


def _ids(engine: Engine, root_id: int) -> list[int]:
    """The jobs of a tree, root first, each before its children."""
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(text(
            "SELECT id FROM postjob.postjobs WHERE root_id = :r ORDER BY id"), {"r": root_id})]


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
        traces = [r[0]["traceparent"].split("-")[1] for r in conn.execute(text(
            "SELECT trace_context FROM postjob.jobs WHERE parent_id = :p"), {"p": parent})]
    assert traces == [f"{trace_id:032x}"] * 2  # a child is in its parent's trace

    runs = [s for s in exporter.get_finished_spans() if s.name.startswith("run ")]
    assert {s.context.trace_id for s in runs} == {trace_id}
    parents = [s for s in runs if s.attributes["postjob.workflow"] == "dur.charge_once"]
    assert [s.attributes["postjob.outcome"] for s in parents] == ["sleep", "sleep", "ok"]
    # the parent's runs are children of the request; each child's run, of the run that
    # spawned it (the first run spawned child 0, the second child 1)
    assert [_parent_of(s) for s in parents] == [request.get_span_context().span_id] * 3
    children = sorted((s for s in runs if s.attributes["postjob.workflow"] == "dur.child"),
                      key=lambda s: int(s.attributes["postjob.job_id"]))
    assert [_parent_of(s) for s in children] == [parents[0].context.span_id,
                                                parents[1].context.span_id]
    first: dict[str, Any] = dict(parents[0].attributes)
    assert first == {"postjob.workflow": "dur.charge_once", "postjob.job_id": parent,
                     "postjob.attempt": 1, "postjob.queue": "q", "postjob.root_id": parent,
                     "postjob.outcome": "sleep"}


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


@pytest.mark.parametrize("workflow", [durable_app.charge_once, durable_app.charge_once_async],
                         ids=["sync", "async"])
def test_a_tree_enqueued_without_a_span_is_one_trace_begun_by_its_first_run(
    side: Engine, exporter: InMemorySpanExporter, workflow: Any
) -> None:
    """No span upstream (a script, cron, `postjob job enqueue`): the first run starts the
    trace and stores it; the re-runs and the children join it, and each child's run is a
    child of the run that spawned it."""
    assert trace.get_current_span() is trace.INVALID_SPAN
    with Session(side) as s:
        parent = JobQueue(s).enqueue(workflow, 2).id
        s.commit()
    assert job(side, parent)["trace_context"] is None
    _drain(side)
    assert job(side, parent)["status"] == "ok"
    runs = _runs(exporter, parent)
    assert [s.attributes["postjob.outcome"] for s in runs] == ["sleep", "sleep", "ok"]
    first = runs[0]
    assert first.parent is None  # the trace begins here
    trace_id = first.context.trace_id
    assert [_parent_of(s) for s in runs[1:]] == [first.context.span_id] * 2
    assert job(side, parent)["trace_context"]["traceparent"].split("-")[1] == f"{trace_id:032x}"
    child_ids = _ids(side, parent)[1:]
    children = [_runs(exporter, c) for c in child_ids]
    assert [len(c) for c in children] == [1, 1]
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {trace_id}
    assert [_parent_of(c[0]) for c in children] == [runs[0].context.span_id,
                                                    runs[1].context.span_id]


@pytest.mark.parametrize("workflow", [durable_app.nest, durable_app.nest_async],
                         ids=["sync", "async"])
def test_a_middle_jobs_reruns_stay_children_of_the_run_that_spawned_it(
    side: Engine, exporter: InMemorySpanExporter, workflow: Any
) -> None:
    """root -> middle -> leaf: the middle job's two runs are children of the root's first
    run (which spawned it), the leaf's run a child of the middle's first run."""
    with Session(side) as s:
        root = JobQueue(s).enqueue(workflow, 2).id
        s.commit()
    _drain(side)
    assert job(side, root)["status"] == "ok"
    root_id, middle_id, leaf_id = _ids(side, root)
    root_runs, middle, leaf = (_runs(exporter, j) for j in (root_id, middle_id, leaf_id))
    assert [len(r) for r in (root_runs, middle, leaf)] == [2, 2, 1]
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {
        root_runs[0].context.trace_id}
    assert [_parent_of(s) for s in root_runs] == [None, root_runs[0].context.span_id]
    assert [_parent_of(s) for s in middle] == [root_runs[0].context.span_id] * 2
    assert [_parent_of(s) for s in leaf] == [middle[0].context.span_id]


def test_a_retried_job_enqueued_without_a_span_is_one_trace(
    side: Engine, exporter: InMemorySpanExporter
) -> None:
    with Session(side) as s:
        job_id = JobQueue(s).enqueue(durable_app.flaky_step).id
        s.commit()
    for _ in range(50):  # the retry is due 0.01 s after the failed attempt
        _drain(side)
        if job(side, job_id)["status"] == "ok":
            break
    runs = _runs(exporter, job_id)
    assert [s.attributes["postjob.outcome"] for s in runs] == ["err", "ok"]
    assert runs[0].parent is None
    assert runs[1].context.trace_id == runs[0].context.trace_id
    assert _parent_of(runs[1]) == runs[0].context.span_id


def test_a_postjob_run_worker_traces_with_the_provider_an_imported_module_sets(
    side: Engine, db_url: URL
) -> None:
    """docs/durable.md's way: `postjob run --import examples.worker_tracing --import ...`;
    the worker's spans (printed by the example's console exporter) are one trace."""
    _reset_provider()
    with Session(side) as s:
        root = JobQueue(s).enqueue(durable_app.nest, 1).id
        s.commit()
    res = postjob("run", "--import", "examples.worker_tracing", "--import",
                  "tests.durable.durable_app", "--count", "3", "--fast",
                  url=url_string(db_url), cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert job(side, root)["status"] == "ok"
    spans = _printed_spans(res.stdout)
    runs = [s for s in spans if s["name"] == "run dur.nest"]
    assert [r["attributes"]["postjob.outcome"] for r in runs] == ["sleep", "ok", "ok"]
    assert {r["context"]["trace_id"] for r in runs} == {runs[0]["context"]["trace_id"]}
    first = runs[0]["context"]["span_id"]
    assert [r["parent_id"] for r in runs] == [None, first, first]  # the leaf's, the root's
    assert runs[0]["resource"]["attributes"]["service.name"] == "shop-worker"


def _printed_spans(out: str) -> list[dict[str, Any]]:
    """The JSON objects ConsoleSpanExporter printed one after the other."""
    decoder = json.JSONDecoder()
    spans, at = [], 0
    while (start := out.find("{", at)) >= 0:
        found, at = decoder.raw_decode(out, start)
        spans.append(found)
    return spans
