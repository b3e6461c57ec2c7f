"""What the revision tests share: two scratch databases (one to upgrade with work in flight, one
fresh for reference) and a digest of the postjob schema's catalog, to show a downgrade gives back
the earlier revision exactly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import URL, Engine, create_engine, text

from tests.conftest import create_clone, drop_database

#: Records one job's outcome ``ok`` under its lease token (``:i``, ``:t``): the lease holds.
FINISH = text(
    "SELECT postjob.finish_jobs(ARRAY[:i]::bigint[], ARRAY[:t]::bigint[], ARRAY['ok'], "
    "ARRAY['[1]'::jsonb], ARRAY[NULL], ARRAY[NULL], ARRAY[NULL::jsonb], ARRAY[''], "
    "ARRAY[NULL::bigint])")
VERSION = text("SELECT postjob.schema_version()")

CATALOG = text("""
SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid))
  FROM pg_proc p WHERE p.pronamespace = 'postjob'::regnamespace
UNION ALL SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'postjob'
UNION ALL SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' '
                 || coalesce(column_default, '') || ' ' || is_nullable
  FROM information_schema.columns WHERE table_schema = 'postjob'
UNION ALL SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'postjob'::regnamespace
UNION ALL SELECT 'enum ' || string_agg(enumlabel, ',' ORDER BY enumsortorder)
  FROM pg_enum WHERE enumtypid = 'postjob.statuses'::regtype
UNION ALL SELECT 'table ' || tablename FROM pg_tables WHERE schemaname = 'postjob'
UNION ALL SELECT 'trigger ' || tgname || ' ' || pg_get_triggerdef(oid) FROM pg_trigger
  WHERE tgrelid = 'postjob.postjobs'::regclass AND NOT tgisinternal
ORDER BY 1
""")


@contextlib.contextmanager
def live_and_fresh(server_url: URL, label: str) -> Iterator[tuple[Engine, Engine]]:
    """Two empty databases, ``{label}_live`` and ``{label}_fresh``, dropped afterwards."""
    urls = [create_clone(server_url, "template0", f"{label}_{n}") for n in ("live", "fresh")]
    engines = [create_engine(u) for u in urls]
    try:
        yield engines[0], engines[1]
    finally:
        for eng, url in zip(engines, urls, strict=True):
            eng.dispose()
            drop_database(server_url, url)


def catalog(engine: Engine) -> list[str]:
    """Every function (by its definition's digest), index, column, constraint, enum label,
    table and trigger of the postjob schema, one line each."""
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(CATALOG)]
