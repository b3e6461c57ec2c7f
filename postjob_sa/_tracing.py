"""OpenTelemetry, when it is installed (extra ``otel``) and a tracer provider is set: an
enqueue stores the current W3C trace context on its job (a child gets its parent's, in the
database), and each run of a job is a span in that trace. Without either, every entry point
costs one check and does nothing."""

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
    return None if found is None else json.dumps(found, separators=(",", ":"))


class RunSpan:
    """The span of one run of a job, current while its workflow runs."""

    def __init__(self, stored: Any, *, workflow: str, job_id: int, attempt: int, queue: str,
                 root_id: int):
        parent = None
        if isinstance(stored, str):
            stored = json.loads(stored)
        if isinstance(stored, dict):
            parent = _PROPAGATOR.extract({k: str(v) for k, v in stored.items()})
        tracer = _trace.get_tracer(SCOPE)
        self.span = tracer.start_span(
            f"run {workflow}", context=parent, kind=_trace.SpanKind.CONSUMER,
            attributes={"postjob.workflow": workflow, "postjob.job_id": job_id,
                        "postjob.attempt": attempt, "postjob.queue": queue,
                        "postjob.root_id": root_id})
        self._token: Any = None

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
