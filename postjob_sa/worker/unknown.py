"""Jobs that no running worker knows: due jobs whose workflow no live worker has registered
(a typo, a workflow defined in a script run directly and stored as ``__main__.name``, a
module no worker imports). Nothing would ever run them, so workers say so, at start and
then now and then while idle, and ``postjob ps`` marks them.

"Live" means a row in ``postjob.workers`` whose heartbeat has not expired; what a worker
knows is the list of workflow names it registered there. Manual steps wait for a person,
never for a worker: they are never unknown. With no live worker at all, no running worker
knows any workflow: every waiting job is marked. Workers of code older than pj0002 do not
register, so while such workers still run (a rolling upgrade) their workflows look unknown.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection

from postjob_sa import _session_sql, _sql
from postjob_sa._db import Failure, failure
from postjob_sa.models import MANUAL_WORKFLOW

log = logging.getLogger("postjob_sa.worker")

#: An idle worker looks again at most this often (seconds).
CHECK_INTERVAL = 60.0
#: Workflows named in one warning; the others are counted.
MAX_NAMES = 10
_WAITING = ("ready", "err")


class _Db(Protocol):
    def rows(self, sql: str, params: Any = None) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Served:
    """The live workers and the workflows they know (for ``ps``)."""

    workers: int
    workflows: frozenset[str]

    def unknown(self, workflow: str, status: str) -> bool:
        """Whether a job with this workflow and status waits for a worker that does not run."""
        return status in _WAITING and workflow != MANUAL_WORKFLOW and workflow not in self.workflows


def served(conn: Connection) -> Served:
    """What the live workers serve, as the database knows it now."""
    lists = conn.execute(_session_sql.WORKERS_LIVE).scalars().all()
    return Served(len(lists), frozenset(name for names in lists for name in names or ()))


def unknown_counts(db: _Db) -> list[tuple[str, int]]:
    """(workflow, due jobs) for each workflow of due jobs that no live worker knows."""
    return [(r["workflow"], int(r["jobs"])) for r in db.rows(_sql.WORKFLOWS_UNKNOWN)]


def warning_text(counts: list[tuple[str, int]]) -> str:
    """The worker's warning about these (workflow, due jobs) pairs."""
    named = ", ".join(f"{name!r} ({n} job{'' if n == 1 else 's'})" for name, n in counts[:MAX_NAMES])
    more = f" and {len(counts) - MAX_NAMES} more" if len(counts) > MAX_NAMES else ""
    text = (f"due jobs wait for workflows that no running worker knows: {named}{more}; start a "
            "worker that imports them (postjob run --import MODULE) or fix their names "
            "(postjob ps marks these jobs)")
    if any(name.startswith("__main__.") for name, _ in counts):
        text += (". A name starting with __main__. comes from a workflow defined in a script run "
                 "directly: give it a name, @postjob_sa.workflow(name=...)")
    return text


class UnknownWorkflows:
    """A worker's look at the jobs no running worker knows: :meth:`check` at start, then
    :meth:`check_if_due` from the idle path, which looks at most every ``interval`` seconds."""

    def __init__(self, interval: float | None = None):
        self.interval = CHECK_INTERVAL if interval is None else interval
        self._next = float("-inf")

    def check_if_due(self, db: _Db) -> None:
        if time.monotonic() >= self._next:
            self.check(db)

    def check(self, db: _Db) -> None:
        """Warn about the due jobs no running worker knows, if there are any. Only a lost
        connection propagates: a look that fails otherwise must not stop the worker."""
        self._next = time.monotonic() + self.interval
        try:
            counts = unknown_counts(db)
        except Exception as exc:
            if failure(exc) is Failure.CONNECTION:
                raise
            log.warning("could not look for jobs no worker knows: %s", " ".join(str(exc).split()))
            return
        if counts:
            log.warning("%s", warning_text(counts))
