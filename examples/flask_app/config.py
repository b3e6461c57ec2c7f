"""Configuration from the environment, shared by the app, the worker and env.py."""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "postgresql+psycopg2:///postjob_example"


def database_url() -> str:
    return os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
