"""Dedicated DBAPI connections for the worker, outside the application's pool."""

from __future__ import annotations

import os
import socket
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session


def engine_of(session: Session) -> Engine:
    bind = session.get_bind()
    if isinstance(bind, Connection):
        return bind.engine
    assert isinstance(bind, Engine)
    return bind


def connect(engine: Engine, *, autocommit: bool = True) -> Any:
    """A new psycopg2 connection to the engine's database (not taken from its pool)."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    conn = engine.dialect.loaded_dbapi.connect(*cargs, **cparams)
    conn.autocommit = autocommit
    return conn


def close_quietly(conn: Any) -> None:
    if conn is None:
        return
    try:
        conn.close()
    except Exception:  # already broken: nothing left to release
        pass


def worker_identifier() -> str:
    """How ``ps`` names this worker process: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"
