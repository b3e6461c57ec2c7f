"""Durable workflows: steps that run once per job, sleeps and event waits that hold no worker.

A workflow re-runs from the top whenever it is woken (a child ended, a sleep is over, an
event came); what it did through these calls is stored in ``postjob.steps`` and given back to
its re-runs instead of being done again.
"""

from __future__ import annotations

from postjob_sa.durable import models  # noqa: F401  (the tables join postjob_sa.metadata)
from postjob_sa.durable.events import wait_for_event, wait_for_event_async
from postjob_sa.durable.sleeping import sleep, sleep_async, sleep_until, sleep_until_async
from postjob_sa.durable.steps import step, step_async

__all__ = [
    "sleep",
    "sleep_async",
    "sleep_until",
    "sleep_until_async",
    "step",
    "step_async",
    "wait_for_event",
    "wait_for_event_async",
]
