"""A revision's script of many statements on asyncpg (sent whole, unprepared): part of the
migration's transaction, its errors the driver's DBAPI errors with their SQLSTATE, and a
failed own-transaction step leaves the connection usable."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import URL, Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from postjob_sa._asyncpg_scripts import is_script, scripts_sent_whole
from postjob_sa.alembic._steps import own_transaction
from tests.migrations.test_async_host import asyncpg_url

T = TypeVar("T")
GONE = "SELECT to_regclass('script_a') IS NULL AND to_regclass('script_b') IS NULL"


def on_asyncpg(db_url: URL, work: Callable[[Connection], T]) -> T:
    async def run() -> T:
        engine = create_async_engine(asyncpg_url(db_url))
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(work)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def test_a_script_is_part_of_the_transaction(db_url: URL) -> None:
    def work(conn: Connection) -> bool:
        with scripts_sent_whole(conn):
            # the first statement of the transaction: it must not run on its own
            conn.exec_driver_sql("CREATE TABLE script_a (); CREATE TABLE script_b ()")
            assert conn.exec_driver_sql("SELECT to_regclass('script_b') IS NOT NULL").scalar()
        conn.rollback()
        return bool(conn.exec_driver_sql(GONE).scalar())

    assert on_asyncpg(db_url, work)


def test_a_failed_script_raises_the_drivers_error(db_url: URL) -> None:
    def work(conn: Connection) -> str | None:
        with scripts_sent_whole(conn), pytest.raises(DBAPIError) as failed:
            conn.exec_driver_sql("CREATE TABLE script_a (); SELECT * FROM no_such_table")
        conn.rollback()
        assert conn.exec_driver_sql(GONE).scalar()
        return getattr(failed.value.orig, "sqlstate", None)

    assert on_asyncpg(db_url, work) == "42P01"


def test_a_failed_own_transaction_step_rolls_back_and_the_connection_goes_on(db_url: URL) -> None:
    def work(conn: Connection) -> bool:
        ctx = MigrationContext.configure(conn, opts={"transaction_per_migration": True})
        with Operations.context(ctx), scripts_sent_whole(conn):
            with ctx.begin_transaction(_per_migration=True):
                with pytest.raises(DBAPIError):
                    own_transaction("CREATE TABLE script_a ();\nSELECT 1 / 0;")
            with ctx.begin_transaction(_per_migration=True):
                own_transaction("CREATE TABLE script_b ();\nDROP TABLE script_b;")
        return bool(conn.exec_driver_sql(GONE).scalar())

    assert on_asyncpg(db_url, work)


def test_what_counts_as_a_script() -> None:
    assert is_script("CREATE TABLE a (); CREATE TABLE b ()")
    assert is_script("DO $$ BEGIN PERFORM 1; END $$")  # sent whole: the same on the server
    assert not is_script("SELECT 1")
    assert not is_script("SET lock_timeout = '5s';\n  ")
