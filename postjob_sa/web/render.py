"""The templates' environment: Jinja2 with autoescaping on every template, and the filters
that turn database values into text (the template escapes that text)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import jinja2
from markupsafe import Markup

from postjob_sa.models import Status

from .charts import STACK
from .redaction import Hidden

#: Longest JSON document shown in full on a job's page.
JSON_LIMIT = 64_000

#: What the pages call each state (every state of the enum; a test checks it).
STATUS_LABELS = {
    Status.ready.value: "ready", Status.processing.value: "processing",
    Status.sleep.value: "sleeping", Status.err.value: "retrying", Status.failed.value: "failed",
    Status.timeout.value: "timed out", Status.cancelled.value: "cancelled", Status.ok.value: "ok",
}
#: The order the pages list the states in: as a job passes through them, the final ones
#: last and ok at the very end (the overview shows ok apart). Every state of the enum.
STATUS_ORDER = tuple(s.value for s in (
    Status.ready, Status.processing, Status.err, Status.sleep,
    Status.failed, Status.timeout, Status.cancelled, Status.ok))


def pretty_json(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=True)
    if len(text) > JSON_LIMIT:
        return text[:JSON_LIMIT] + f"\n… ({len(text) - JSON_LIMIT:,} more characters)"
    return text


def iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def utc(value: datetime | None) -> str:
    if value is None:
        return "–"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def number(value: int | None) -> str:
    return "–" if value is None else f"{int(value):,}"


def seconds(value: float | None) -> str:
    """45s, 3m12s, 2h05m, 4d03h."""
    if value is None:
        return "–"
    s = int(round(float(value)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def tags_text(tags: dict[str, Any] | None) -> str:
    if not tags:
        return ""
    return ", ".join(f"{k}:{v}" for k, v in sorted(tags.items()))


def content_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("postjob_sa.web", "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        json=pretty_json, iso=iso, utc=utc, number=number, seconds=seconds, tags=tags_text,
    )
    env.globals.update(STATUS_LABELS=STATUS_LABELS, STATUS_ORDER=STATUS_ORDER, STACK=STACK)
    env.tests["hidden"] = lambda value: isinstance(value, Hidden)
    return env


def live_region(name: str, html: str) -> Markup:
    """A fragment the page script refreshes: its name and the hash of its content."""
    return (
        Markup('<div class="live" data-fragment="%s" data-hash="%s">') % (name, content_hash(html))
        + Markup(html)
        + Markup("</div>")
    )
