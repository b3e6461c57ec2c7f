"""Configuration from the environment, shared by the app, the worker and env.py."""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "postgresql+psycopg2:///postjob_example"


def database_url() -> str:
    return os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)


def admin_password() -> str | None:
    """The password of the dashboard at /admin/jobs (user admin); unset: nobody gets in."""
    return os.environ.get("ADMIN_PASSWORD") or None
