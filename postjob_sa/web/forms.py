"""Parsing what a browser sends: the list's filters and the resolve form. Every parser
raises InvalidArgument with one clear line; nothing unparsed reaches a query."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from werkzeug.datastructures import MultiDict

from postjob_sa import _validate
from postjob_sa.errors import InvalidArgument
from postjob_sa.models import Status

from .job_queries import JobFilter

#: The ages the list offers (newer than / older than).
AGES = {"5m": 300, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
STATUSES = [s.value for s in Status]
MAX_TEXT = 200


def _text(args: MultiDict[str, str], key: str) -> str | None:
    value = args.get(key, "").strip()
    if not value:
        return None
    if len(value) > MAX_TEXT:
        raise InvalidArgument(f"{key} is longer than {MAX_TEXT} characters")
    return value


def tags_json(text: str | None) -> str | None:
    """``k:v,k2:v2`` into the JSON a containment filter binds; the value may hold ':'."""
    if text is None:
        return None
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise InvalidArgument(f"malformed tag filter {text!r}: expected key:value[,key:value…]")
        out[key.strip()] = value.strip()
    return _validate.tags_json(out)


def cursor(args: MultiDict[str, str]) -> int | None:
    value = args.get("before", "").strip()
    if not value:
        return None
    if not value.isdigit() or len(value) > 19:
        raise InvalidArgument(f"not a cursor: {value!r}")
    return int(value)


@dataclass
class ListQuery:
    """The list's filters as the form shows them, and as the query binds them."""

    statuses: list[str]
    queue: str | None
    workflow: str | None
    tag: str | None
    newer: str | None
    older: str | None

    def to_filter(self, now: datetime) -> JobFilter:
        return JobFilter(
            statuses=self.statuses or None,
            queue=self.queue,
            workflow=self.workflow,
            tags_json=tags_json(self.tag),
            created_after=now - timedelta(seconds=AGES[self.newer]) if self.newer else None,
            created_before=now - timedelta(seconds=AGES[self.older]) if self.older else None,
        )

    def params(self) -> list[tuple[str, str]]:
        """The query string of these filters (for links to other pages of the list)."""
        out = [("status", s) for s in self.statuses]
        for key in ("queue", "workflow", "tag", "newer", "older"):
            value = getattr(self, key)
            if value:
                out.append((key, value))
        return out


def list_query(args: MultiDict[str, str]) -> ListQuery:
    statuses: list[str] = []
    for value in args.getlist("status"):
        for name in value.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in STATUSES:
                raise InvalidArgument(f"unknown status {name!r}: expected one of {', '.join(STATUSES)}")
            if name not in statuses:
                statuses.append(name)
    ages: dict[str, str | None] = {}
    for key in ("newer", "older"):
        age = _text(args, key)
        if age is not None and age not in AGES:
            raise InvalidArgument(f"{key} must be one of {', '.join(AGES)}, not {age!r}")
        ages[key] = age
    query = ListQuery(
        statuses, _text(args, "queue"), _text(args, "workflow"), _text(args, "tag"),
        ages["newer"], ages["older"],
    )
    tags_json(query.tag)  # reject a malformed tag filter now
    return query


@dataclass
class Resolution:
    token: str
    value: Any
    error: str | None


def resolution(form: MultiDict[str, str]) -> Resolution:
    """The resolve form: a token, and either a JSON value or an error message."""
    token = form.get("token", "").strip()
    if not token:
        raise InvalidArgument("the manual step's token is missing")
    if form.get("outcome", "value") == "error":
        message = form.get("error", "").strip()
        if not message:
            raise InvalidArgument("give the error message that fails the step")
        return Resolution(token, None, message)
    raw = form.get("value", "").strip()
    if not raw:
        raise InvalidArgument("give the step's value as JSON (e.g. true, 42, \"text\", {\"by\": \"ann\"})")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"the value is not JSON: {exc.msg} (quote strings: \"text\")") from None
    return Resolution(token, value, None)
