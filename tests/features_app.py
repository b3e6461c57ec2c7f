"""Workflows of the feature tests that run real worker processes
(``--import tests.features_app``)."""

from __future__ import annotations

import time

import postjob_sa


@postjob_sa.workflow(name="fx.slow")
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
