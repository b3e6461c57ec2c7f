"""Workflows and data for the dashboard's tests and screenshots: an order tree three levels
deep with a manual step, a failed job with a traceback, an XSS payload, and jobs of a
workflow no worker knows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, workflow

APPROVERS: list[str] = []
XSS = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"


@workflow(name="web.label")
def label(order_id: int, n: int) -> str:
    return f"label-{order_id}-{n}.pdf"


@workflow(name="web.pack")
def pack(order_id: int) -> list[str]:
    labels = [label.spawn(order_id, n) for n in range(2)]
    return [h.result() for h in labels]


@workflow(name="web.order")
def order(order_id: int) -> dict[str, Any]:
    labels = pack.spawn(order_id).result()
    step = postjob_sa.manual("approve order", order_id)
    APPROVERS.append(step.token)  # stands in for the e-mail that carries the token
    decision = step.result()
    return {"order": order_id, "labels": labels, "approved_by": decision}


@workflow(name="web.flaky", max_attempts=1)
def flaky(what: str) -> None:
    raise ConnectionError(f"could not reach {what}")


@workflow(name="web.noop")
def noop(value: Any = None) -> Any:
    return value


@dataclass
class Seeded:
    order: int  # the root, asleep on its manual step
    pack: int
    labels: list[int]
    manual: int
    token: str
    failed: int
    xss: int
    stranded: int


def seed(engine: Engine) -> Seeded:
    """Run real workflows until the order waits for its manual step."""
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True)
        root = q.enqueue(order, 7, tags={"customer": "acme"}).id
        failed = q.enqueue(flaky, "the mail server").id
        xss = q.enqueue(flaky, XSS).id
        stranded = q.enqueue("web.nobody_runs_this", 1, queue="reports").id
        s.commit()
        q.drain()
        rows = s.execute(
            text("SELECT j.id, j.workflow, j.parent_id, t.token::text AS token FROM postjob.jobs j "
                 "LEFT JOIN postjob.tokens t ON t.postjob_id = j.id WHERE j.root_id = :r ORDER BY j.id"),
            {"r": root},
        ).all()
    by_workflow: dict[str, list[Any]] = {}
    for r in rows:
        by_workflow.setdefault(r.workflow, []).append(r)
    manual_row = by_workflow["__manual__"][0]
    _workers_gone(engine)
    return Seeded(
        order=root, pack=by_workflow["web.pack"][0].id,
        labels=[r.id for r in by_workflow["web.label"]], manual=manual_row.id,
        token=manual_row.token, failed=failed, xss=xss, stranded=stranded,
    )


def _workers_gone(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until the drain's worker connection has left pg_stat_activity: a backend is listed
    for a moment after its client closed it, and the overview counts it as a worker up."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            left = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'postjob worker %'")).scalar_one()
        if not left:
            return
        assert time.monotonic() < deadline, f"{left} worker connection(s) still open"
        time.sleep(0.02)


def backdate(engine: Engine, seconds: float) -> None:
    """Make every waiting job due that long ago (the overview's 'stranded' needs age)."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE postjob.postjobs SET next_run_at = next_run_at - make_interval(secs => :s) "
                 "WHERE status IN ('ready', 'err')"),
            {"s": seconds},
        )
        conn.execute(  # what checkout and the overview read: the waiting rows
            text("UPDATE postjob.unfinished SET run_at = run_at - make_interval(secs => :s) "
                 "WHERE run_at IS NOT NULL"),
            {"s": seconds},
        )
