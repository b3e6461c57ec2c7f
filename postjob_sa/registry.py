"""The workflow registry: ``@postjob_sa.workflow`` and what a worker may check out."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from postjob_sa import _validate
from postjob_sa.errors import InvalidArgument
from postjob_sa.models import MANUAL_WORKFLOW

if TYPE_CHECKING:
    from postjob_sa.context import ChildHandle

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

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn)

    @property
    def is_async(self) -> bool:
        """Whether the workflow is an ``async def`` (it runs on the worker's event loop)."""
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def spawn(
        self,
        *args: Any,
        timeout: float | None = None,
        max_attempts: int | None = None,
        queue: str | None = None,
    ) -> ChildHandle:
        """The child job of the running job for this workflow and these args.

        Created on the parent's first run, found again on every re-run.
        """
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
        if old is not None and old.fn is not wf.fn and old.fn.__qualname__ != wf.fn.__qualname__:
            raise InvalidArgument(
                f"workflow {wf.name!r} is already registered for {old.fn.__module__}.{old.fn.__qualname__}"
            )
        self.workflows[wf.name] = wf

    def get(self, name: str) -> Workflow[Any, Any] | None:
        return self.workflows.get(name)

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
) -> Any:
    """Register a function as a workflow; its job's args are passed positionally.

    ``name`` defaults to ``module.qualname``; ``version`` pins re-runs to this code version;
    ``max_attempts``, ``timeout`` (seconds, whole-lifetime deadline) and ``queue`` are the
    defaults for its jobs; with ``transactional=True`` the function receives the worker's
    Session first and its writes commit together with the job's completion.
    """

    def register(f: Callable[..., Any]) -> Workflow[Any, Any]:
        wf_name = name if name is not None else f"{f.__module__}.{f.__qualname__}"
        wf = Workflow(
            fn=f,
            name=_validate.name(wf_name, "workflow name"),
            version=version if version == "" else _validate.name(version, "version"),
            max_attempts=_validate.max_attempts(max_attempts),
            timeout=_validate.seconds(timeout, "timeout"),
            queue=None if queue is None else _validate.name(queue, "queue"),
            transactional=transactional,
        )
        (registry or default_registry).add(wf)
        return wf

    if fn is not None:
        return register(fn)
    return register
