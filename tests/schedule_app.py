"""A periodic workflow for worker processes (``--import tests.schedule_app``)."""

from __future__ import annotations

import postjob_sa


@postjob_sa.workflow(name="sx.every_second", every=1)
def every_second() -> str:
    return "tick"
