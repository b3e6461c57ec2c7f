"""What PostgreSQL will store: strict JSON for args, tags and results, and text made storable.

jsonb and text refuse more than Python's ``json`` does: a NUL character (``\\u0000``), a lone
surrogate (``os.fsdecode(b"\\xff")`` gives ``"\\udcff"``), and documents over its size limit.
:func:`encode` refuses all of these up front, so a value is either stored or rejected with a
reason before anything is written; :func:`storable` escapes text the worker must store whatever
it holds (error messages, tracebacks).
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

#: jsonb refuses documents near 256 MiB; refuse well before the server has to.
MAX_DOCUMENT_BYTES = 128 << 20

#: How to pass a common value JSON has no type for (the first match counts: datetime before date).
_HINTS: tuple[tuple[type | tuple[type, ...], str, str], ...] = (
    (Decimal, "a Decimal", "use str(value), and Decimal(text) to read it back"),
    (datetime, "a datetime", "use value.isoformat(), and datetime.fromisoformat(text) to read it back"),
    (date, "a date", "use value.isoformat(), and date.fromisoformat(text) to read it back"),
    (time, "a time", "use value.isoformat(), and time.fromisoformat(text) to read it back"),
    (uuid.UUID, "a UUID", "use str(value), and uuid.UUID(text) to read it back"),
    ((set, frozenset), "a set", "use a list, e.g. sorted(value)"),
    ((bytes, bytearray), "bytes", "use text, e.g. base64.b64encode(value).decode()"),
)


def _refuse(value: Any) -> Any:
    """The encoder's answer to a value JSON has no type for: how to pass it instead."""
    for types, what, hint in _HINTS:
        if isinstance(value, types):
            verb = "are" if what == "bytes" else "is"
            raise TypeError(f"{what} {verb} not JSON: {hint}")
    raise TypeError(
        f"{_article(type(value).__name__)} {type(value).__name__} is not JSON (JSON has "
        "strings, numbers, booleans, null, lists, and objects with string keys)"
    )


def _article(word: str) -> str:
    """'an' before a vowel sound (an object, an ellipsis, an umbrella), else 'a' (a set, a
    User, a unit)."""
    lower = word.lower()
    vowel = lower[:1] in ("a", "e", "i", "o") or (
        lower[:1] == "u" and not re.match(r"u[^aeiou][aeiou]", lower))
    return "an" if vowel else "a"


# One strict encoder, reused (json.dumps with options builds a new one per call).
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False,
                            default=_refuse)
# A JSON escape of NUL: an odd run of backslashes before u0000 (an even run is an escaped
# backslash followed by the six characters "u0000", which PostgreSQL stores).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class NotStorable(ValueError):
    """The value cannot be stored as JSON by PostgreSQL; the message says why."""


def encode(value: Any) -> str:
    """Strict JSON of ``value`` that PostgreSQL's jsonb accepts, or :class:`NotStorable`."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise NotStorable(str(exc)) from None
    except RecursionError:
        raise NotStorable("it is nested too deeply") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise NotStorable("it contains a NUL character (\\u0000), which PostgreSQL cannot store")
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise NotStorable(
                f"it contains {bad!r}, a lone surrogate that is not valid Unicode "
                "(e.g. a file name decoded with os.fsdecode): encode or replace it first"
            ) from None
    else:
        size = len(text)
    if size > MAX_DOCUMENT_BYTES:
        raise NotStorable(f"it is {size} bytes of JSON; the limit is {MAX_DOCUMENT_BYTES}")
    return text


def storable(text: str, limit: int | None = None) -> str:
    """``text`` cut to ``limit`` characters, with what PostgreSQL refuses escaped: NUL as
    ``\\0`` and lone surrogates as ``\\udcff``-style escapes."""
    if limit is not None and len(text) > limit:
        text = text[:limit]
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
