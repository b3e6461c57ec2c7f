"""How long a failed job waits before its next attempt: a policy of the code, not of the
database (the worker hands the delay to the outcome it records, so changing it needs no
migration). A workflow may bring its own (``@postjob_sa.workflow(backoff=fn)``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

log = logging.getLogger("postjob_sa.worker")

#: The seed's back-off: 10 s after the first failed attempt, then 1.5 times longer each time.
BASE_SECONDS = 10.0
#: The base in fast mode (tests).
FAST_BASE_SECONDS = 0.01
GROWTH = 1.5
#: The longest delay a back-off may ask for (about ten years); longer ones are cut to it.
MAX_SECONDS = 3.2e8

#: ``fn(attempt) -> seconds``: the wait after the ``attempt``-th failed attempt (1 for the first).
Backoff = Callable[[int], float]


def default(attempt: int, *, fast: bool = False) -> float:
    """The seed's delay after the ``attempt``-th failed attempt: ``base * 1.5 ** (attempt - 1)``
    seconds, base 10 s (0.01 s in fast mode)."""
    base = FAST_BASE_SECONDS if fast else BASE_SECONDS
    return min(base * GROWTH ** max(attempt - 1, 0), MAX_SECONDS)


def delay(backoff: Backoff | None, attempt: int, *, fast: bool, workflow: str) -> float:
    """The seconds to wait after the ``attempt``-th failed attempt of ``workflow``: its own
    back-off's answer, or the default when it has none, or when its answer is not a number
    of seconds it can wait (logged: a retry is never lost to a broken policy)."""
    if backoff is None:
        return default(attempt, fast=fast)
    try:
        seconds = float(backoff(attempt))
    except Exception as exc:
        log.error("workflow %s: its backoff(%d) raised %s: %s; the default back-off applies",
                  workflow, attempt, type(exc).__name__, exc)
        return default(attempt, fast=fast)
    if math.isnan(seconds) or seconds < 0:
        log.error("workflow %s: its backoff(%d) gave %r, not a number of seconds >= 0; the "
                  "default back-off applies", workflow, attempt, seconds)
        return default(attempt, fast=fast)
    return min(seconds, MAX_SECONDS)
