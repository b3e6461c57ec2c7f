"""The jobs a worker rescues from dead workers, one log line each.

The reap (``postjob.reap_v4``, run by checkouts and idle waits now and then) hands the jobs of
a lease whose worker has gone (its lease ended, or its connection is gone) back to the queue (or fails them, with no attempts left) and
says only how many. A worker that is about to reap looks first at what is there to rescue (the
leases table: one row per checkout in flight, so the look is cheap, and it finds nothing
unless a worker died), and after the reap logs each of those jobs that was rescued: the job,
its workflow, the worker that held it and when that worker's lease ended (or that its
connection is gone). Two workers that
reap at once may both log a job one of them rescued.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from postjob_sa import _sql

log = logging.getLogger("postjob_sa.worker")


class _Db(Protocol):
    def rows(self, sql: str, params: Any = None) -> list[dict[str, Any]]: ...


def look(db: _Db) -> list[dict[str, Any]]:
    """The jobs a reap now would rescue (before it)."""
    return db.rows(_sql.JOBS_OF_GONE_WORKERS)


def report(db: _Db, seen: list[dict[str, Any]]) -> None:
    """After the reap: one warning per job of ``seen`` that it rescued."""
    if not seen:
        return
    rescued = db.rows(_sql.JOBS_RESCUED, {"ids": [j["id"] for j in seen],
                                          "tokens": [j["lease_token"] for j in seen],
                                          "attempts": [j["failed_attempts"] for j in seen]})
    before = {j["id"]: j for j in seen}
    for row in rescued:
        job = before[row["id"]]
        what = ("failed (no attempts left)" if row["status"] == "failed" else
                f"to be retried (attempt {row['failed_attempts'] + 1} of {row['max_attempts']})")
        why = ("whose connection is gone" if job["connection_gone"] else
               "whose lease expired at "
               + job["expires_at"].astimezone().strftime("%H:%M:%S"))
        log.warning("job %s (%s) rescued from worker %s, %s: %s",
                    row["id"], job["workflow"], job["holder"] or "unknown", why, what,
                    extra={"job_id": row["id"], "workflow": job["workflow"],
                           "outcome": "rescued", "status": row["status"]})
