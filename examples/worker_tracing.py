"""OpenTelemetry for a ``postjob run`` worker: a module the worker imports before the
workflows, so the tracer provider is set before any job runs::

    postjob run --import examples.worker_tracing --import examples.fastapi_app.workflows

Each run of a job is then a span (printed to stdout here: an app sends them to its
collector with an OTLP exporter instead of ``ConsoleSpanExporter``).
"""

from __future__ import annotations

# docs: begin provider
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

provider = TracerProvider(resource=Resource.create({"service.name": "shop-worker"}))
provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)  # the spans left are sent when the worker exits
# docs: end provider
