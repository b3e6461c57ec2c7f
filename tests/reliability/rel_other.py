"""Workflows only some of the reliability tests' workers import
(``--import tests.reliability.rel_other``, beside ``tests.reliability.rel_app``): a worker
that imports this module serves workflows the others do not."""

from __future__ import annotations

import time

import postjob_sa
from tests.reliability.rel_app import record


@postjob_sa.workflow(name="rel.other")
def other(key: int) -> int:
    """One execution, one row (as rel.record, under another name)."""
    record("run")
    return key


@postjob_sa.workflow(name="rel.long_first")
def long_first(seconds: float) -> str:
    """The first attempt records its start and sleeps ``seconds`` (long enough to be killed in);
    a later one (a rescue) records its start and ends at once."""
    record("start")
    if postjob_sa.current_job().attempt == 1:
        time.sleep(seconds)
    record("end")
    return "done"
