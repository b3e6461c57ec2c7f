"""Configuration from the environment, shared by the app, the worker and env.py."""

from __future__ import annotations

import os

from sqlalchemy.engine import URL, make_url

DEFAULT_DATABASE_URL = "postgresql+psycopg2:///postjob_example"


def database_url() -> str:
    return os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)


def async_url(url: str | URL) -> URL:
    """The same database through psycopg 3's async driver (what AsyncSession needs)."""
    return make_url(url).set(drivername="postgresql+psycopg")


def admin_password() -> str | None:
    """The password of the dashboard at /admin/jobs (user admin); unset: nobody gets in."""
    return os.environ.get("ADMIN_PASSWORD") or None
