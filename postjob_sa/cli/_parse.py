"""Parsing command-line values. Every parser raises InvalidArgument with one clear line."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from postjob_sa import _validate
from postjob_sa.errors import InvalidArgument
from postjob_sa.models import FINAL_STATUSES, Status

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def job_id(text: str) -> int:
    """A job id as typed: a positive integer."""
    value = text.strip()
    if not value.isdigit():
        raise InvalidArgument(f"not a job id: {text!r} (job ids are positive integers)")
    return _validate.job_id(int(value))


def job_ids(texts: tuple[str, ...] | list[str]) -> list[int]:
    return [job_id(t) for t in texts]


def tags(text: str | None) -> dict[str, str] | None:
    """``k:v,k2:v2`` into a mapping; the value may contain ':' (split on the first one)."""
    if text is None:
        return None
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition(":")
        key = key.strip()
        if not sep or not key:
            raise InvalidArgument(f"malformed tags {text!r}: expected key:value[,key:value…]")
        if key in out:
            raise InvalidArgument(f"malformed tags {text!r}: the tag {key!r} is given twice")
        out[key] = value.strip()
    return out


def tags_json(text: str | None) -> str | None:
    """The JSON a tag filter binds (``tags @> CAST(:tags AS jsonb)``)."""
    parsed = tags(text)
    return None if parsed is None else _validate.tags_json(parsed)


def statuses(text: str | None, *, allowed: frozenset[Status] | None = None) -> list[str] | None:
    """``ok,failed`` into a list of status names."""
    if text is None:
        return None
    choices = allowed or frozenset(Status)
    names = sorted(s.value for s in choices)
    out: list[str] = []
    for item in text.split(","):
        name = item.strip()
        if name not in names:
            raise InvalidArgument(f"unknown status {name!r}: expected one of {', '.join(names)}")
        if name not in out:
            out.append(name)
    return out


def final_statuses(text: str | None) -> list[str]:
    return statuses(text, allowed=FINAL_STATUSES) or sorted(s.value for s in FINAL_STATUSES)


def duration(text: str, what: str = "duration", *,
             maximum: float = _validate.MAX_DURATION_SECONDS) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``1h30m`` or a plain number of seconds, at most
    ``maximum`` seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos = 0
        seconds = 0.0
        for match in _DURATION.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
            pos = match.end()
        if pos == 0 or pos != len(value):
            raise InvalidArgument(
                f"not a {what}: {text!r} (use e.g. 30d, 12h, 90m, 45s or 1h30m)"
            ) from None
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidArgument(f"the {what} must be more than 0 seconds, not {text!r}")
    if seconds > maximum:
        raise InvalidArgument(f"the {what} must be at most {maximum / 86400:g} days, not {text!r}")
    return seconds


def json_value(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f"{what} is not JSON: {text!r} ({exc.msg}; quote strings, e.g. '\"text\"')"
        ) from None


def timestamp(text: str) -> datetime:
    """ISO-8601; without a UTC offset it is local time."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"not an ISO-8601 time: {text!r} (e.g. 2030-01-31T12:00:00+00:00)"
        ) from None
    return value if value.tzinfo is not None else value.astimezone()


def positive_int(value: int | None, what: str, maximum: int = 1_000_000) -> int | None:
    if value is None:
        return None
    if not 1 <= value <= maximum:
        raise InvalidArgument(f"{what} must be between 1 and {maximum}, not {value}")
    return value
