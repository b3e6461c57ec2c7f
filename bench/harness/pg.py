"""Administrative PostgreSQL helpers (psycopg2, autocommit, short-lived connections)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import psycopg2
from psycopg2 import sql as pgsql

SERVER_SETTINGS = (
    "server_version",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_sync_method",
    "wal_level",
    "commit_delay",
    "shared_buffers",
    "work_mem",
    "maintenance_work_mem",
    "effective_cache_size",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "jit",
    "autovacuum",
    "random_page_cost",
)


def url_for(base: str, dbname: str) -> str:
    return f"{base.rstrip('/')}/{dbname}"


def execute(url: str, *statements: str | pgsql.Composable) -> list[tuple[Any, ...]]:
    """Run statements one by one in autocommit; return the rows of the last one (if any)."""
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        rows: list[tuple[Any, ...]] = []
        with conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt)
                rows = cur.fetchall() if cur.description is not None else []
        return rows
    finally:
        conn.close()


def value(url: str, statement: str) -> Any:
    return execute(url, statement)[0][0]


def fresh_database(base: str, dbname: str) -> str:
    """Drop (kicking out sessions) and create `dbname`; return its URL."""
    name = pgsql.Identifier(dbname)
    admin = url_for(base, "postgres")
    execute(
        admin,
        pgsql.SQL(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = {} AND pid <> pg_backend_pid()"
        ).format(pgsql.Literal(dbname)),
        pgsql.SQL("DROP DATABASE IF EXISTS {}").format(name),
        pgsql.SQL("CREATE DATABASE {}").format(name),
    )
    return url_for(base, dbname)


def settle(url: str, tables: Iterable[str]) -> None:
    """Untimed housekeeping before a timed phase: fresh planner stats, no dirty buffers."""
    execute(url, *[f"ANALYZE {t}" for t in tables], "CHECKPOINT")


def transactions(url: str) -> int:
    """xact_commit + xact_rollback of the current database (pg_stat_database)."""
    return int(
        value(
            url,
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()",
        )
    )


def transactions_after_quiet(url: str, wait_s: float = 0.5) -> int:
    """Like transactions(), after giving exiting backends time to flush their statistics."""
    time.sleep(wait_s)
    return transactions(url)


def backend_pids(url: str) -> list[int]:
    """Other sessions connected to the same database (e.g. the workers' backends)."""
    rows = execute(
        url,
        "SELECT pid FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    return [int(r[0]) for r in rows]


def other_databases_activity(url: str) -> dict[str, int]:
    """Sessions in other databases: running a statement now, and holding an xid/xmin.

    The latter matter for (e): an open transaction anywhere in the cluster holds
    back every snapshot's xmin, so dead index entries cannot be marked dead.
    """
    active, in_xact = execute(
        url,
        "SELECT count(*) FILTER (WHERE state = 'active'), "
        "count(*) FILTER (WHERE backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) "
        "FROM pg_stat_activity WHERE datname IS NOT NULL AND datname <> current_database()",
    )[0]
    return {"other_db_active": int(active), "other_db_in_xact": int(in_xact)}


def server_settings(url: str) -> dict[str, str]:
    rows = execute(
        url,
        pgsql.SQL(
            "SELECT name, setting, coalesce(unit, '') FROM pg_settings WHERE name IN ({})"
        ).format(pgsql.SQL(", ").join(pgsql.Literal(n) for n in SERVER_SETTINGS)),
    )
    out = {name: f"{setting}{' x ' + unit if unit else ''}" for name, setting, unit in rows}
    out["shared_buffers_human"] = str(value(url, "SHOW shared_buffers"))
    out["version"] = str(value(url, "SELECT version()"))
    return out


def tables_like(url: str, prefix: str) -> list[str]:
    """Ordinary tables in schema public whose name starts with `prefix`."""
    rows = execute(
        url,
        pgsql.SQL(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename LIKE {} ORDER BY tablename"
        ).format(pgsql.Literal(prefix + "%")),
    )
    return [r[0] for r in rows]
