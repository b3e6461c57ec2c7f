"""OpenTelemetry, when it is installed (extra ``otel``) and a tracer provider is set: an
enqueue stores the current W3C trace context on its job (a child gets its parent's, in the
database), and each run of a job is a span in that trace. Without either, every entry point
costs one check and does nothing.

A job stored with no trace context (enqueued where no span was current: a script, cron,
``postjob job enqueue``) begins its trace at its first run, whose span is stored; its re-runs
and its children join it. A child's runs are children of the run that spawned it: before a
run's first spawn, its job's row is given that run's context (the children inherit it in the
database), and keeps the parent of its own runs under ``postjob_runs`` (with ``postjob_job``
naming the job it is about, so a child that inherits the row does not take it for its own).
"""

from __future__ import annotations

import json
from typing import Any

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the otel extra is not installed
    _trace = None  # type: ignore[assignment]

_PROPAGATOR: Any = TraceContextTextMapPropagator() if _trace is not None else None
_OFF: tuple[type, ...] = ((_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
                          if _trace is not None else ())
SCOPE = "postjob_sa"


def enabled() -> bool:
    """Whether OpenTelemetry is installed and a tracer provider is set."""
    return _trace is not None and not isinstance(_trace.get_tracer_provider(), _OFF)


def carrier() -> dict[str, str] | None:
    """The current trace context (``{"traceparent": ..., "tracestate": ...}``) for a job being
    enqueued; None when nothing is traced here."""
    if not enabled():
        return None
    found: dict[str, str] = {}
    _PROPAGATOR.inject(found)
    return found or None


def current_context() -> str | None:
    """:func:`carrier` as JSON text (a bound parameter of an INSERT)."""
    found = carrier()
    return None if found is None else _dumps(found)


def _dumps(found: dict[str, str]) -> str:
    return json.dumps(found, separators=(",", ":"))


#: What a run adds to its job's stored context before it spawns (see the module's doc).
_JOB = "postjob_job"
_RUNS = "postjob_runs"
_RUNS_STATE = "postjob_runs_state"
_W3C = ("traceparent", "tracestate")


def _w3c(found: dict[str, Any]) -> dict[str, str] | None:
    carried = {k: str(found[k]) for k in _W3C if found.get(k)}
    return carried if "traceparent" in carried else None


def runs_parent(stored: Any, job_id: int) -> dict[str, str] | None:
    """The W3C context the runs of job ``job_id`` are children of, from its stored
    ``trace_context`` (JSON text or a dict); None: the job has none yet."""
    if isinstance(stored, str):
        stored = json.loads(stored)
    if not isinstance(stored, dict):
        return None
    if stored.get(_JOB) == str(job_id) and stored.get(_RUNS):
        return _w3c({"traceparent": stored[_RUNS], "tracestate": stored.get(_RUNS_STATE)})
    return _w3c(stored)


class RunSpan:
    """The span of one run of a job, current while its workflow runs.

    ``store`` is the JSON to store as the job's context now (its first run, when it had
    none), ``for_children`` the JSON to store before the run's first spawn (None: the stored
    context is this run's already)."""

    def __init__(self, stored: Any, *, workflow: str, job_id: int, attempt: int, queue: str,
                 root_id: int):
        parent = runs_parent(stored, job_id)
        tracer = _trace.get_tracer(SCOPE)
        self.span = tracer.start_span(
            f"run {workflow}",
            context=None if parent is None else _PROPAGATOR.extract(parent),
            kind=_trace.SpanKind.CONSUMER,
            attributes={"postjob.workflow": workflow, "postjob.job_id": job_id,
                        "postjob.attempt": attempt, "postjob.queue": queue,
                        "postjob.root_id": root_id})
        self._token: Any = None
        own: dict[str, str] = {}
        _PROPAGATOR.inject(own, context=_trace.set_span_in_context(self.span))
        self.store: str | None = None
        self.for_children: str | None = None
        if parent is None:  # the trace begins with this run: its re-runs and children join it
            self.store = _dumps(own)
        else:
            self.for_children = _dumps({**own, _JOB: str(job_id), _RUNS: parent["traceparent"],
                                        **({_RUNS_STATE: parent["tracestate"]}
                                           if "tracestate" in parent else {})})

    def __enter__(self) -> RunSpan:
        self._token = _otel_context.attach(_trace.set_span_in_context(self.span))
        return self

    def leave(self) -> None:
        """No longer the current span (the workflow has returned)."""
        if self._token is not None:
            _otel_context.detach(self._token)
            self._token = None

    def __exit__(self, *exc: object) -> None:
        self.leave()

    def end(self, outcome: str, error: str | None = None, message: str | None = None) -> None:
        """End the span with how the run ended (ok, err, failed, sleep, release, lost)."""
        self.span.set_attribute("postjob.outcome", outcome)
        if outcome in ("err", "failed"):
            self.span.set_status(_trace.Status(_trace.StatusCode.ERROR,
                                               f"{error}: {message}" if error else message))
        self.span.end()
