"""Argument checks shared by the API and the CLI: every one raises InvalidArgument before
anything is written."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from postjob_sa import _json
from postjob_sa.errors import InvalidArgument

MAX_ARGS_BYTES = 1 << 20  # 1 MiB of JSON per job's args
MAX_ATTEMPTS_LIMIT = 1000
MAX_TIMEOUT_SECONDS = 366 * 24 * 3600.0
#: The longest span any duration may be (how long to keep history, what to prune): a hundred
#: years, well inside what a timestamp can take away from now.
MAX_DURATION_SECONDS = 100 * 366 * 24 * 3600.0
MAX_NAME_LENGTH = 200
MAX_PRIORITY = 1_000_000


def name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if any(ord(c) < 32 for c in value):
        raise InvalidArgument(f"{what} must not contain control characters: {value!r}")
    if not value.isascii() and any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise InvalidArgument(f"{what} must be valid Unicode (it holds a lone surrogate): {value!r}")
    return value


def text(value: str, what: str) -> str:
    """A string PostgreSQL stores as it is (no NUL, no lone surrogate); InvalidArgument otherwise."""
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{what} must be valid Unicode (it holds a lone surrogate)") from None
    return value


def to_json(value: Any, what: str) -> str:
    """Strict JSON that PostgreSQL stores; InvalidArgument (saying why) otherwise."""
    try:
        return _json.encode(value)
    except _json.NotStorable as exc:
        raise InvalidArgument(f"{what} cannot be stored as JSON: {exc}") from None


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


def priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"priority must be an integer, not {value!r}")
    if not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgument(f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, not {value}")
    return value


#: A queue's limits: at most this many jobs at once, or starts in a period (each is a row the
#: checkout locks: see postjob_sa/sql/limits.sql).
MAX_LIMIT = 100_000
#: A rate limit's period: from a millisecond to a year.
MIN_PERIOD_SECONDS = 0.001
MAX_PERIOD_SECONDS = 366 * 86400.0


def count(value: object, what: str) -> int | None:
    """A limit: None, or a whole number from 0 to MAX_LIMIT."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LIMIT:
        raise InvalidArgument(f"{what} must be a whole number from 0 to {MAX_LIMIT}, not {value!r}")
    return value


def period(value: object) -> float:
    """A rate limit's period in seconds: from 1 ms to a year."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"period must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or not MIN_PERIOD_SECONDS <= value <= MAX_PERIOD_SECONDS:
        raise InvalidArgument(
            f"period must be from {MIN_PERIOD_SECONDS:g} s (1 ms) to {MAX_PERIOD_SECONDS:g} s "
            f"(a year), not {value!r}")
    return float(value)


def job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(f"a job id must be a positive integer, not {value!r}")
    if value >= 1 << 63:
        raise InvalidArgument(f"job id {value} is out of range")
    return value


def keywords_refused(called: str, method: Callable[..., Any], keywords: Mapping[str, Any]
                     ) -> InvalidArgument:
    """The refusal of ``keywords`` given to ``called`` (``"JobQueue.enqueue"``, the class the
    caller used): a workflow's arguments are positional; the method's options are named."""
    options = [p.name for p in inspect.signature(method).parameters.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    name = called.rpartition(".")[2]
    given = ", ".join(repr(k) for k in keywords)
    return InvalidArgument(
        f"{called}() got the keyword{'s' if len(keywords) > 1 else ''} {given}: a workflow's "
        "arguments are positional (pass them in order, or one dict of named values), and the "
        f"options of {name} are {', '.join(options)}"
    )
