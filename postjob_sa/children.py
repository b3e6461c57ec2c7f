"""A running parent's children as its workflow sees them: :class:`ChildHandle` (the result,
the status, a manual job's token) and what a spawn asks for (``_ChildSpec``). The run's
context (postjob_sa.context) finds and creates the children; a handle reads them through it.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from postjob_sa import _sql
from postjob_sa._pending import Pending
from postjob_sa.errors import ChildFailed, NotInJob
from postjob_sa.models import FINAL_STATUSES, MANUAL_WORKFLOW, Status

_ChildKey = tuple[str, str]  # (workflow, canonical JSON of args)


class _JobId(Protocol):
    @property
    def id(self) -> int: ...


class _Run(Protocol):
    """What a handle asks of the run that made it (postjob_sa.context's run context)."""

    @property
    def job(self) -> _JobId: ...

    def is_current(self) -> bool: ...

    def check_held(self) -> None: ...

    async def check_held_async(self) -> None: ...

    def child(self, key: _ChildKey) -> dict[str, Any]: ...

    async def child_async(self, key: _ChildKey) -> dict[str, Any]: ...

    def query(self, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]: ...

    async def query_async(self, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]: ...


@dataclass
class _ChildSpec:
    workflow: str
    args_json: str
    queue: str
    max_attempts: int
    timeout: float | None


@dataclass(eq=False)
class ChildHandle:
    """A child job as the running parent sees it in this run.

    In an ``async def`` workflow, ``await handle`` gives the result (``result()`` would block
    the event loop for a round trip), and ``await handle.token_async()`` the token;
    ``await asyncio.gather(*handles)`` gives them all. Two handles are equal when they name
    the same child in the same run (spawned with the same workflow and args); handles can be
    put in sets and used as keys.
    """

    _ctx: _Run
    _key: _ChildKey
    _row: dict[str, Any] | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChildHandle):
            return NotImplemented
        return self._ctx is other._ctx and self._key == other._key

    def __hash__(self) -> int:  # what the row read in this run says is no part of it
        return hash((id(self._ctx), self._key))

    def _in_run(self) -> None:
        """Refuse use outside the run that made this handle (NotInJob, not the internal
        Pending a wait would raise there)."""
        if not self._ctx.is_current():
            raise NotInJob(
                f"this handle of a child of job {self._ctx.job.id} is used outside the run that "
                "spawned it: use it inside that workflow, while it runs"
            )

    def _loaded(self) -> dict[str, Any]:
        self._in_run()
        if self._row is None:
            self._row = self._ctx.child(self._key)
        return self._row

    async def _loaded_async(self) -> dict[str, Any]:
        self._in_run()
        if self._row is None:
            self._row = await self._ctx.child_async(self._key)
        return self._row

    @property
    def id(self) -> int:
        return int(self._loaded()["id"])

    @property
    def status(self) -> Status:
        """The child's status as read in this run."""
        return Status(self._loaded()["status"])

    @property
    def token(self) -> str:
        """The token that finishes this manual job (``JobQueue.resolve``)."""
        row = self._loaded()
        if "token" not in row:  # created on first use, then remembered for this run
            row["token"] = str(self._ctx.query(_sql.MANUAL_TOKEN, self._token_params(row))[0]["token"])
        return str(row["token"])

    async def token_async(self) -> str:
        """The token, from an ``async def`` workflow."""
        row = await self._loaded_async()
        if "token" not in row:
            rows = await self._ctx.query_async(_sql.MANUAL_TOKEN, self._token_params(row))
            row["token"] = str(rows[0]["token"])
        return str(row["token"])

    @staticmethod
    def _token_params(row: dict[str, Any]) -> dict[str, Any]:
        if row["workflow"] != MANUAL_WORKFLOW:
            raise NotInJob(f"job {row['id']} is not a manual job and has no token")
        return {"job_id": row["id"]}

    def result(self) -> Any:
        """The child's result; raises ChildFailed if it failed, timed out or was cancelled;
        otherwise the parent sleeps until the child ends and then re-runs from the top. Outside
        the run that spawned the child it raises NotInJob; once the parent is cancelled,
        JobCancelled."""
        self._in_run()
        self._ctx.check_held()
        return _result_of(self._loaded())

    def __await__(self) -> Generator[Any, None, Any]:
        """``await handle``: the result, as :meth:`result` gives it, without blocking the loop."""
        return self._result_async().__await__()

    async def _result_async(self) -> Any:
        self._in_run()
        await self._ctx.check_held_async()
        return _result_of(await self._loaded_async())


def _result_of(row: dict[str, Any]) -> Any:
    status = Status(row["status"])
    if status is Status.ok:
        results = row["results"]
        return results[0] if isinstance(results, list) and results else None
    if status in FINAL_STATUSES:
        raise ChildFailed(row["id"], status.value, row["error"], row["error_message"])
    raise Pending(int(row["id"]))
