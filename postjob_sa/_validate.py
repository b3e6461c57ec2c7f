"""Argument checks shared by the API and the CLI: every one raises InvalidArgument before
anything is written."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from postjob_sa.errors import InvalidArgument

MAX_ARGS_BYTES = 1 << 20  # 1 MiB of JSON per job's args
MAX_ATTEMPTS_LIMIT = 1000
MAX_TIMEOUT_SECONDS = 366 * 24 * 3600.0
MAX_NAME_LENGTH = 200

# one strict encoder, reused (json.dumps with options builds a new encoder per call)
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if any(ord(c) < 32 for c in value):
        raise InvalidArgument(f"{what} must not contain control characters: {value!r}")
    return value


def to_json(value: Any, what: str) -> str:
    """Encode as strict JSON (no NaN/Infinity); InvalidArgument if it is not JSON."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} must be JSON-serialisable: {exc}") from None
    if "\\u0000" in text:
        raise InvalidArgument(f"{what} must not contain NUL characters")
    return text


def args_json(args: Any) -> str:
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, (list, tuple)):
        raise InvalidArgument(f"args must be a list of positional arguments, not {args!r}")
    text = to_json(args if isinstance(args, list) else list(args), "args")
    if len(text) * 4 > MAX_ARGS_BYTES and len(text.encode()) > MAX_ARGS_BYTES:
        raise InvalidArgument(f"args are {len(text.encode())} bytes of JSON; the limit is {MAX_ARGS_BYTES}")
    return text


def args_json_many(arg_lists: Any) -> tuple[str, int]:
    """A JSON array of the args lists, encoded in one pass; and how many there are."""
    lists = []
    for args in arg_lists:
        if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, (list, tuple)):
            raise InvalidArgument(f"args must be a list of positional arguments, not {args!r}")
        lists.append(args)
    text = to_json(lists, "args")
    if len(text) > MAX_ARGS_BYTES // 4:  # one of them may be over the limit: look closer
        for args in lists:
            args_json(args)
    return text, len(lists)


def tags_json(tags: Mapping[str, Any] | None) -> str | None:
    if tags is None:
        return None
    if not isinstance(tags, Mapping):
        raise InvalidArgument(f"tags must be a mapping of names to values, not {tags!r}")
    for key, val in tags.items():
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"tag names must be non-empty strings, not {key!r}")
        if val is not None and not isinstance(val, (str, int, float, bool)):
            raise InvalidArgument(f"tag {key!r} must have a scalar value, not {val!r}")
    return to_json(dict(tags), "tags")


def max_attempts(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"max_attempts must be an integer, not {value!r}")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, not {value}")
    return value


def seconds(value: object, what: str, *, maximum: float = MAX_TIMEOUT_SECONDS) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{what} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value <= 0 or value > maximum:
        raise InvalidArgument(f"{what} must be more than 0 and at most {maximum:g} seconds, not {value!r}")
    return float(value)


def run_at(value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidArgument(f"run_at must be a datetime, not {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    return value


def job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(f"a job id must be a positive integer, not {value!r}")
    if value >= 1 << 63:
        raise InvalidArgument(f"job id {value} is out of range")
    return value
