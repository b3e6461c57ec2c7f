"""Reading and pruning jobs for the CLI (no rendering here)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from postjob_sa._schema_base import errored_only
from postjob_sa.errors import JobNotFound
from postjob_sa.models import Job

from . import _statements as sql


@dataclass
class Listing:
    rows: list[dict[str, Any]]
    more: bool  # more rows matched than the limit


def require_jobs(conn: Connection | Session, ids: list[int]) -> None:
    found = {r[0] for r in conn.execute(sql.JOBS_EXISTING, {"ids": ids})}
    missing = [str(i) for i in ids if i not in found]
    if missing:
        noun = "id" if len(missing) == 1 else "ids"
        raise JobNotFound(f"no job has the {noun} {', '.join(missing)}")


def _tree_key(row: dict[str, Any]) -> tuple[int, ...]:
    return tuple(int(p) for p in str(row["full_id"] or row["id"]).split("."))


def list_jobs(
    conn: Connection,
    *,
    ids: list[int] | None = None,
    tags_json: str | None = None,
    statuses: list[str] | None = None,
    limit: int = 100,
) -> Listing:
    """Root jobs newest first; with ids, the subtrees under those jobs in tree order."""
    params: dict[str, Any] = {"tags": tags_json, "statuses": statuses, "limit": limit + 1}
    if ids:
        require_jobs(conn, ids)
        result = conn.execute(sql.JOB_SUBTREES, {**params, "ids": ids})
    else:
        roots = sql.ROOT_JOBS_LIST_ERRORED if errored_only(statuses) else sql.ROOT_JOBS_LIST
        result = conn.execute(roots, params)
    rows = [dict(r) for r in result.mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    if ids:
        rows.sort(key=lambda r: (-int(r["root_id"] or r["id"]), _tree_key(r)))
    return Listing(rows, more)


def subtrees(conn: Connection, ids: list[int], limit: int = 10_000) -> list[list[dict[str, Any]]]:
    """For each id (in order), its job and all descendants in tree order."""
    listing = list_jobs(conn, ids=ids, limit=limit)
    by_id = {r["id"]: r for r in listing.rows}
    trees: list[list[dict[str, Any]]] = []
    for anchor in ids:
        prefix = str(by_id[anchor]["full_id"]) + "."
        members = [r for r in listing.rows if r["id"] == anchor or str(r["full_id"]).startswith(prefix)]
        trees.append(sorted(members, key=_tree_key))
    return trees


def show_jobs(engine: Engine, ids: list[int]) -> list[tuple[Job, str | None]]:
    """Every field of these jobs (in the order asked), with the token of manual ones."""
    with Session(engine) as session:
        require_jobs(session, ids)
        jobs = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(ids)))}
        tokens = {r[0]: r[1] for r in session.execute(sql.TOKENS_OF_JOBS, {"ids": ids})}
        session.expunge_all()
    return [(jobs[i], tokens.get(i)) for i in ids]


def manual_tokens(conn: Connection | Session, root_id: int) -> list[tuple[int, str]]:
    return [(int(r[0]), str(r[1])) for r in conn.execute(sql.MANUAL_TOKENS_OF_TREE, {"root_id": root_id})]


@dataclass
class PruneReport:
    roots: int = 0
    jobs: int = 0
    batches: int = 0
    cutoff: datetime | None = None


def prune(
    engine: Engine, *, older_than: float, statuses: list[str], batch: int, dry_run: bool = False
) -> PruneReport:
    """Delete finished root jobs (whole trees, all final) older than the cut-off, one
    transaction per batch of trees, so a large prune never holds long locks."""
    report = PruneReport()
    with engine.connect() as conn:
        report.cutoff = conn.execute(sql.PRUNE_CUTOFF, {"seconds": older_than}).scalar_one()
        if dry_run:
            roots, jobs = conn.execute(
                sql.PRUNABLE_COUNT, {"cutoff": report.cutoff, "statuses": statuses}
            ).one()
            report.roots, report.jobs = int(roots), int(jobs)
            return report
    params = {"cutoff": report.cutoff, "statuses": statuses, "batch": batch}
    while True:
        with engine.begin() as conn:
            roots, jobs = conn.execute(sql.PRUNE_BATCH, params).one()
        report.roots += int(roots)
        report.jobs += int(jobs)
        report.batches += 1
        if roots < batch:
            return report
