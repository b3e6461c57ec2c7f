"""``step(name, fn, *args, **kwargs)``: run ``fn`` once for the job and ``name``; every re-run
gets the stored result (or the stored non-recoverable error) without calling it again."""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

from postjob_sa import _json, _validate
from postjob_sa.context import _RunContext
from postjob_sa.durable import memo as _memo
from postjob_sa.durable.memo import STEP, Memo, Stored, log
from postjob_sa.errors import DuplicateStep, NonRecoverable, ResultNotJSON


def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` once for the running job and ``name``, store its JSON
    result, and return it; every re-run of the job returns the stored result without calling
    ``fn``. A step that raises is not stored (the job's retry calls it again), unless the
    error is :class:`NonRecoverable`: re-runs raise it again. Each step of a run needs a name
    of its own (:class:`~postjob_sa.errors.DuplicateStep`); a re-run that calls a stored step
    with other arguments gets the stored result, and a warning is logged."""
    ctx, memo = _memo.running()
    digest = _begin(ctx, memo, name, args, kwargs)
    _memo.load(ctx, memo)
    stored = memo.get(STEP, name)
    if stored is None:
        try:
            value = fn(*args, **kwargs)
        except NonRecoverable as exc:
            _memo.record(ctx, memo, STEP, name, digest=digest, **_error_fields(exc))
            raise
        stored = _memo.record(ctx, memo, STEP, name, digest=digest, result=_encode(name, value))
    return _replay(ctx, name, stored, digest)


async def step_async(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """:func:`step` in an ``async def`` workflow: ``fn`` is a coroutine function (awaited;
    a plain function is called)."""
    ctx, memo = _memo.running()
    digest = _begin(ctx, memo, name, args, kwargs)
    await _memo.load_async(ctx, memo)
    stored = memo.get(STEP, name)
    if stored is None:
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except NonRecoverable as exc:
            await _memo.record_async(ctx, memo, STEP, name, digest=digest, **_error_fields(exc))
            raise
        stored = await _memo.record_async(ctx, memo, STEP, name, digest=digest,
                                          result=_encode(name, value))
    return _replay(ctx, name, stored, digest)


def _begin(ctx: _RunContext, memo: Memo, name: str, args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> str | None:
    """Claim the name for this run; the digest of the arguments."""
    _validate.text(_validate.name(name, "a step's name"), "a step's name")
    if name in memo.used:
        raise DuplicateStep(f"job {ctx.job.id}: the step name {name!r} is used twice in one run "
                            "(give each step of a workflow a name of its own)")
    memo.used.add(name)
    return digest(args, kwargs)


def digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """md5 of the arguments' JSON (None when they are not JSON: then they are not compared)."""
    try:
        text = json.dumps([list(args), kwargs], sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return hashlib.md5(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()


def _encode(name: str, value: Any) -> str:
    try:
        return _json.encode([value])
    except _json.NotStorable as exc:
        raise ResultNotJSON(f"step {name!r} returned a value that cannot be stored as JSON: "
                            f"{exc}") from None


def _error_fields(exc: NonRecoverable) -> dict[str, Any]:
    cls = type(exc)
    try:
        args = _json.encode(list(exc.args))
    except _json.NotStorable:
        args = _json.encode([_json.storable(str(exc))])
    return {"result": args, "error": f"{cls.__module__}:{cls.__qualname__}",
            "message": _json.storable(str(exc), 10_000)}


def _replay(ctx: _RunContext, name: str, stored: Stored, called: str | None) -> Any:
    """The stored result, or the stored error raised again."""
    if called is not None and stored.digest is not None and called != stored.digest:
        log.warning("job %s: step %r is called with other arguments than the run that stored "
                    "it (was the code changed under the job?): its stored result is used",
                    ctx.job.id, name)
    if stored.error is not None:
        raise _stored_error(name, stored)
    result = stored.result
    return result[0] if isinstance(result, list) and result else None


def _stored_error(name: str, stored: Stored) -> NonRecoverable:
    """The error a step raised when it ran: of its own class if that is loaded and takes its
    arguments back, else a NonRecoverable that names it."""
    module, _, qualname = (stored.error or "").partition(":")
    found: Any = sys.modules.get(module)
    for part in qualname.split(".") if found is not None else ():
        found = getattr(found, part, None)
    args = stored.result if isinstance(stored.result, list) else [stored.message]
    if isinstance(found, type) and issubclass(found, NonRecoverable):
        try:
            exc = found(*args)
        except Exception:
            exc = found.__new__(found)
            exc.args = tuple(args)
        return exc
    return NonRecoverable(f"step {name!r} failed when it ran: {stored.error}: {stored.message}")
