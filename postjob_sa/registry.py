"""The workflow registry: ``@postjob_sa.workflow`` and what a worker may check out."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Never, ParamSpec, TypeVar, overload

from postjob_sa import _validate
from postjob_sa._backoff import Backoff
from postjob_sa._schedule import ScheduleSpec
from postjob_sa.errors import InvalidArgument
from postjob_sa.models import MANUAL_WORKFLOW

if TYPE_CHECKING:
    from postjob_sa.children import ChildHandle

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(eq=False)
class Workflow(Generic[P, R]):
    """A registered workflow. Calling it calls the function; ``spawn`` runs it as a child job."""

    fn: Callable[P, R]
    name: str
    version: str = ""
    max_attempts: int | None = None
    timeout: float | None = None
    queue: str | None = None
    transactional: bool = False
    #: when it runs by itself (``cron=`` or ``every=``), or None
    schedule: ScheduleSpec | None = None
    #: ``fn(attempt) -> seconds`` to wait after a failed attempt; None: the default
    backoff: Backoff | None = None
    #: entered around each run by a worker (``JobQueue(..., job_context=app.app_context)``)
    job_context: Callable[[], AbstractContextManager[Any]] | None = None

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn)
        self._is_async = inspect.iscoroutinefunction(self.fn)
        self._signature = _job_signature(self.fn, self.transactional)

    @property
    def is_async(self) -> bool:
        """Whether the workflow is an ``async def`` (it runs on the worker's event loop)."""
        return self._is_async

    def args_problem(self, args: Sequence[Any]) -> str | None:
        """Why a job's ``args`` cannot be passed to the function (positionally, after the
        worker's Session for a transactional one); None when they can, or when the function
        has no signature to read."""
        if self._signature is None:
            return None
        try:
            self._signature.bind(*args)
        except TypeError as exc:
            return str(exc)
        return None

    def mismatch(self, args: Sequence[Any], problem: str) -> str:
        """The one line that says a job's ``args`` do not fit (``problem``: args_problem's)."""
        shown = json.dumps(list(args), ensure_ascii=False, default=repr)
        if len(shown) > MAX_SHOWN_ARGS:
            shown = shown[: MAX_SHOWN_ARGS - 3] + "..."
        return f"the args {shown} do not fit workflow {self.name!r} {self._signature}: {problem}"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def spawn(
        self,
        *args: Any,
        timeout: float | None = None,
        max_attempts: int | None = None,
        queue: str | None = None,
        **keywords: Never,
    ) -> ChildHandle:
        """The child job of the running job for this workflow and these args (positional:
        a keyword that is not an option is refused).

        Created on the parent's first run, found again on every re-run.
        """
        if keywords:
            raise _validate.keywords_refused("Workflow.spawn", Workflow.spawn, keywords)
        from postjob_sa.context import spawn_child

        return spawn_child(
            self.name,
            list(args),
            timeout=timeout if timeout is not None else self.timeout,
            max_attempts=max_attempts if max_attempts is not None else self.max_attempts,
            queue=queue if queue is not None else self.queue,
        )


@dataclass
class Registry:
    """Workflows by name. A worker checks out only the (name, version) pairs registered here."""

    workflows: dict[str, Workflow[Any, Any]] = field(default_factory=dict)

    def add(self, wf: Workflow[Any, Any]) -> None:
        if wf.name == MANUAL_WORKFLOW:
            raise InvalidArgument(f"{MANUAL_WORKFLOW} is reserved for manual jobs")
        old = self.workflows.get(wf.name)
        # the same function again (a module reloaded) replaces itself; another one is refused
        if old is not None and _where(old.fn) != _where(wf.fn):
            raise InvalidArgument(
                f"workflow name {wf.name!r} is taken by {_where(old.fn)}: {_where(wf.fn)} "
                "cannot be registered under it too; give one of them another name "
                "(@postjob_sa.workflow(name=...))"
            )
        self.workflows[wf.name] = wf

    def get(self, name: str) -> Workflow[Any, Any] | None:
        return self.workflows.get(name)

    def check_args(self, workflow: Workflow[Any, Any] | str, version: str | None,
                   arg_lists: Iterable[Sequence[Any]], *, numbered: bool = False) -> None:
        """InvalidArgument unless each of ``arg_lists`` fits the function of ``workflow`` (a
        workflow, or a name registered here) for jobs of ``version`` (None: the workflow's
        own). Nothing is checked where this process does not have that function."""
        known = workflow if isinstance(workflow, Workflow) else self.get(workflow)
        if known is None or (version is not None and version != known.version):
            return
        for number, args in enumerate(arg_lists, 1):
            problem = known.args_problem(args)
            if problem is not None:
                where = f"args list {number}: " if numbered else ""
                raise InvalidArgument(where + known.mismatch(args, problem))

    def with_job_context(self, job_context: Callable[[], AbstractContextManager[Any]]) -> Registry:
        """These workflows, each run inside ``job_context()`` (a worker's copy)."""
        return Registry({name: dataclasses.replace(wf, job_context=job_context)
                         for name, wf in self.workflows.items()})

    def pairs(
        self, names: Iterable[str] | None = None, *, transactional: bool | None = None,
        is_async: bool | None = None,
    ) -> tuple[list[str], list[str]]:
        """(names, versions) arrays for checkout, optionally restricted."""
        chosen = set(names) if names is not None else None
        out_names: list[str] = []
        out_versions: list[str] = []
        for wf in self.workflows.values():
            if chosen is not None and wf.name not in chosen:
                continue
            if transactional is not None and wf.transactional != transactional:
                continue
            if is_async is not None and wf.is_async != is_async:
                continue
            out_names.append(wf.name)
            out_versions.append(wf.version)
        return out_names, out_versions


#: How much of a job's args a mismatch message shows.
MAX_SHOWN_ARGS = 200


def _job_signature(fn: Callable[..., Any], transactional: bool) -> inspect.Signature | None:
    """The parameters a job's args are bound to, without annotations (shown in messages as
    ``(email, plan='free')``); a transactional workflow's first one, the worker's Session,
    left out. None when the function has no signature to read (a builtin)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if transactional and params and params[0].kind is not inspect.Parameter.VAR_POSITIONAL:
        params = params[1:]
    return inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params])


def _where(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function, as error messages name it."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_session_parameter(fn: Callable[..., Any], name: str) -> None:
    """A transactional workflow receives the worker's Session first: it needs a parameter."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call tell
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    if not any(p.kind in positional for p in params):
        raise InvalidArgument(
            f"workflow {name!r} is transactional: the worker passes its Session as the first "
            f"argument, but {_where(fn)} takes no positional parameter "
            "(e.g. def send(session: Session, ...))"
        )


def _warn_if_main(fn: Callable[..., Any], name: str, depth: int) -> None:
    """A workflow defined in a script run directly is named ``__main__.…``: a worker that
    imports the script knows it by another name, and the jobs would wait for ever."""
    if fn.__module__ != "__main__":
        return
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    path = getattr(main, "__file__", None)
    module = spec.name if spec is not None else Path(path).stem if path else "your_module"
    warnings.warn(
        f"workflow {name!r} is defined in a script run directly, and its jobs are stored under "
        f"that name: a worker that imports the script (postjob run --import {module}) knows it "
        f"as '{module}.{fn.__qualname__}' and never runs them. Name it, "
        f"@postjob_sa.workflow(name='{fn.__qualname__}'), or define it in a module you import",
        stacklevel=depth + 1,
    )


#: The registry ``@workflow`` adds to and ``JobQueue`` uses unless given another.
default_registry = Registry()


@overload
def workflow(fn: Callable[P, R], /) -> Workflow[P, R]: ...


@overload
def workflow(
    *,
    name: str | None = None,
    version: str = "",
    max_attempts: int | None = None,
    timeout: float | None = None,
    queue: str | None = None,
    transactional: bool = False,
    registry: Registry | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    every: float | None = None,
    skip_missed: bool = False,
    backoff: Backoff | None = None,
) -> Callable[[Callable[P, R]], Workflow[P, R]]: ...


def workflow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    version: str = "",
    max_attempts: int | None = None,
    timeout: float | None = None,
    queue: str | None = None,
    transactional: bool = False,
    registry: Registry | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    every: float | None = None,
    skip_missed: bool = False,
    backoff: Backoff | None = None,
) -> Any:
    """Register a function as a workflow; its job's args are passed positionally.

    ``name`` defaults to ``module.qualname``; ``version`` pins re-runs to this code version;
    ``max_attempts``, ``timeout`` (seconds, whole-lifetime deadline) and ``queue`` are the
    defaults for its jobs; with ``transactional=True`` the function receives the worker's
    Session first and its writes commit together with the job's completion.

    A periodic workflow (called without args): ``cron="m h dom mon dow"`` (five fields; six
    are refused) in ``timezone`` (an IANA name, default UTC), or ``every=seconds``; running workers enqueue one job per tick
    between them. After downtime the most recent missed tick runs once; with
    ``skip_missed=True`` a tick runs only if it is claimed on time (see docs/features.md).

    ``backoff(attempt) -> seconds`` is how long a job waits after its ``attempt``-th failed
    attempt (1 for the first); the default is ``10 * 1.5 ** (attempt - 1)`` (base 0.01 s in
    fast mode). It runs in the worker, so changing it needs no migration.
    """
    spec = ScheduleSpec.build(cron, timezone, every, skip_missed)
    if backoff is not None and not callable(backoff):
        raise InvalidArgument(
            f"backoff must be a function of the attempt number giving seconds, not {backoff!r}")

    def register(f: Callable[..., Any], _depth: int = 2) -> Workflow[Any, Any]:
        wf_name = name if name is not None else f"{f.__module__}.{f.__qualname__}"
        if transactional:
            _check_session_parameter(f, wf_name)
        if name is None:
            _warn_if_main(f, wf_name, _depth)
        wf = Workflow(
            fn=f,
            name=_validate.name(wf_name, "workflow name"),
            version=version if version == "" else _validate.name(version, "version"),
            max_attempts=_validate.max_attempts(max_attempts),
            timeout=_validate.seconds(timeout, "timeout"),
            queue=None if queue is None else _validate.name(queue, "queue"),
            transactional=transactional,
            schedule=spec,
            backoff=backoff,
        )
        (registry or default_registry).add(wf)
        return wf

    if fn is not None:
        return register(fn, 3)
    return register
