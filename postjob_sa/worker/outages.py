"""How a worker rides out a failed statement: a conflict with another transaction is tried again
a few times, a lost connection is reconnected after growing pauses, anything else stops it."""

from __future__ import annotations

import logging

from postjob_sa import _metrics
from postjob_sa._db import Failure, failure, sqlstate
from postjob_sa._migrations import MIGRATE_HINT, schema_error
from postjob_sa.errors import SchemaError

log = logging.getLogger("postjob_sa.worker")

#: The pauses before each reconnect in a row (the last one repeats).
RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
#: What a worker says when its schema went away under it (a downgrade while it ran).
SCHEMA_GONE = ("the postjob schema is gone from this database while the worker ran "
               f"(downgraded or dropped?): {MIGRATE_HINT}")
SCHEMA_OLDER = ("the postjob schema in this database became older than this code while the "
                f"worker ran (downgraded?): {MIGRATE_HINT}")
UNDEFINED_FUNCTION = "42883"
#: Conflicts (deadlocks, serialization failures) met in a row before the worker gives up.
CONFLICT_LIMIT = 10


class Backoff:
    """The growing pauses between attempts to reach the database."""

    def __init__(self, delays: tuple[float, ...] = RECONNECT_DELAYS) -> None:
        self.delays = delays
        self.failures = 0

    def next(self) -> float:
        """The pause before the next attempt (one failure more)."""
        delay = self.delays[min(self.failures, len(self.delays) - 1)]
        self.failures += 1
        return delay

    def reset(self) -> bool:
        """The database was reached: start over. Whether attempts had failed before."""
        failed, self.failures = self.failures > 0, 0
        return failed


class Outages:
    """What the worker loop does after a statement failed."""

    def __init__(self) -> None:
        self.backoff = Backoff()
        self.conflicts = 0

    def passed(self) -> None:
        """A turn of the loop went through: the next failure starts the count again."""
        self.backoff.reset()
        self.conflicts = 0

    def plan(self, exc: Exception) -> tuple[float, bool] | None:
        """The pause before the loop tries again and whether it reconnects first, or None when
        the error is not one to ride out (the loop raises it). A statement that met no postjob
        schema (or an older one: a downgrade while the worker ran) raises the SchemaError that
        says so, with what to run."""
        if schema_error(exc) is not None:
            older = sqlstate(exc) == UNDEFINED_FUNCTION  # the tables are there, not our functions
            raise SchemaError(SCHEMA_OLDER if older else SCHEMA_GONE) from exc
        kind = failure(exc)
        message = " ".join(str(exc).split())[:300]
        if kind is Failure.TRANSIENT and self.conflicts < CONFLICT_LIMIT:
            self.conflicts += 1
            log.warning("%s: trying again", message)
            return 0.05 * self.conflicts, False
        if kind is not Failure.CONNECTION:
            return None
        delay = self.backoff.next()
        log.warning("database unreachable (%s); reconnecting in %.2fs", message, delay)
        _metrics.reconnected()
        return delay, True
