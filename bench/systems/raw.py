"""raw: the floor. A minimal queue written directly against psycopg2.

* one table, `raw_job`, with a partial index on the runnable rows only;
* every statement is PREPAREd once per connection and runs in autocommit, so one
  statement is one round trip and one transaction;
* a statement-level trigger sends one NOTIFY per enqueuing statement;
* checkout is a single UPDATE of up to $1 rows picked with FOR UPDATE SKIP LOCKED;
  completion is a second UPDATE (per job, or per batch).
"""

from __future__ import annotations

import json
import select
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg2

from bench.harness import pg
from bench.harness.measure import now
from bench.systems.base import (
    CheckoutCase,
    DrainCheck,
    EnqueueVariant,
    Options,
    System,
    WorkerConfig,
)

if TYPE_CHECKING:
    from bench.harness.gate import Gate

CHANNEL = "raw_job_added"

DDL = f"""
CREATE TABLE raw_job (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state      text        NOT NULL DEFAULT 'queued',  -- queued | running | done
    not_before timestamptz NOT NULL DEFAULT now(),
    payload    jsonb       NOT NULL,
    tries      integer     NOT NULL DEFAULT 0
);
CREATE INDEX raw_job_runnable ON raw_job (not_before) WHERE state = 'queued';
CREATE FUNCTION raw_job_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '');
    RETURN NULL;
END $$;
CREATE TRIGGER raw_job_wake AFTER INSERT ON raw_job
    FOR EACH STATEMENT EXECUTE FUNCTION raw_job_wake();
"""


def _statements(take_limit: int) -> dict[str, str]:
    """Statements to PREPARE; the checkout LIMIT is a literal so that the cached
    generic plan is the ordered index scan (a LIMIT $1 lets the planner pick a
    sort-based plan once it stops making custom plans)."""
    return {
        "put_one": "(jsonb) AS INSERT INTO raw_job (payload) VALUES ($1)",
        "put_many": "(jsonb[]) AS INSERT INTO raw_job (payload) SELECT unnest($1)",
        "take": (
            "AS UPDATE raw_job SET state = 'running', tries = tries + 1 "
            "WHERE id = ANY(ARRAY("
            "  SELECT id FROM raw_job WHERE state = 'queued' AND not_before <= now() "
            f"  ORDER BY not_before LIMIT {int(take_limit)} FOR UPDATE SKIP LOCKED"
            ")) RETURNING id, payload"
        ),
        "finish_one": "(bigint) AS UPDATE raw_job SET state = 'done' WHERE id = $1",
        "finish_many": "(bigint[]) AS UPDATE raw_job SET state = 'done' WHERE id = ANY($1)",
    }


class RawConnection:
    """An autocommit psycopg2 connection with the queue's statements prepared."""

    def __init__(self, url: str, take_limit: int = 1) -> None:
        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True
        self.cur = self.conn.cursor()
        for name, body in _statements(take_limit).items():
            self.cur.execute(f"PREPARE {name} {body}")

    def put_one(self, payload: str) -> None:
        self.cur.execute("EXECUTE put_one(%s)", (payload,))

    def put_many(self, payloads: list[str]) -> None:
        self.cur.execute("EXECUTE put_many(%s::jsonb[])", (payloads,))

    def take(self) -> list[tuple[int, dict[str, Any]]]:
        """Check out up to take_limit runnable jobs (one transaction)."""
        self.cur.execute("EXECUTE take")
        return self.cur.fetchall()

    def finish(self, ids: list[int]) -> None:
        if len(ids) == 1:
            self.cur.execute("EXECUTE finish_one(%s)", (ids[0],))
        else:
            self.cur.execute("EXECUTE finish_many(%s::bigint[])", (ids,))

    def close(self) -> None:
        self.conn.close()


def _payload(key: int) -> str:
    return json.dumps({"key": key})


def _enqueue_singly(url: str, keys: Sequence[int]) -> float:
    db = RawConnection(url)
    payloads = [_payload(k) for k in keys]
    t0 = now()
    for p in payloads:
        db.put_one(p)
    elapsed = now() - t0
    db.close()
    return elapsed


def _enqueue_batched(url: str, keys: Sequence[int], batch: int) -> float:
    db = RawConnection(url)
    payloads = [_payload(k) for k in keys]
    chunks = [payloads[i : i + batch] for i in range(0, len(payloads), batch)]
    t0 = now()
    for chunk in chunks:
        db.put_many(chunk)
    elapsed = now() - t0
    db.close()
    return elapsed


class RawProducer:
    def __init__(self, url: str) -> None:
        self._db = RawConnection(url)

    def enqueue(self, key: int) -> tuple[float, float]:
        payload = _payload(key)
        t_call = now()
        self._db.put_one(payload)
        return t_call, now()

    def close(self) -> None:
        self._db.close()


class RawCheckoutProbe:
    def __init__(self, url: str) -> None:
        self._db = RawConnection(url)
        self.table_bytes = int(pg.value(url, "SELECT pg_total_relation_size('raw_job')"))
        self.index_bytes = int(pg.value(url, "SELECT pg_relation_size('raw_job_runnable')"))

    def checkout_one(self) -> bool:
        return bool(self._db.take())

    def explain(self) -> str:
        self._db.cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) EXECUTE take")
        return "\n".join(r[0] for r in self._db.cur.fetchall())

    def close(self) -> None:
        self._db.close()


class Raw(System):
    name = "raw"
    is_peer = False
    requires = ("psycopg2",)
    distributions = ("psycopg2-binary",)

    def setup(self, url: str) -> None:
        pg.execute(url, DDL)

    def reset(self, url: str) -> None:
        pg.execute(
            url,
            "TRUNCATE raw_job RESTART IDENTITY",
            "ALTER TABLE raw_job RESET (autovacuum_enabled)",
        )

    def tables(self, url: str) -> list[str]:
        return ["raw_job"]

    def job_count(self, url: str) -> int:
        return int(pg.value(url, "SELECT count(*) FROM raw_job"))

    def enqueue_variants(self, opts: Options) -> list[EnqueueVariant]:
        return [EnqueueVariant("sql", one_per_txn=_enqueue_singly, batched=_enqueue_batched)]

    def worker_configs(self, opts: Options) -> list[WorkerConfig]:
        return [
            WorkerConfig("1/txn", {"batch": 1}),
            WorkerConfig(f"{opts.raw_batch}/txn", {"batch": opts.raw_batch}),
        ]

    def prefill(self, url: str, keys: Sequence[int]) -> None:
        _enqueue_batched(url, keys, 1000)

    def work(self, url: str, config: WorkerConfig, gate: Gate) -> None:
        db = RawConnection(url, take_limit=int(config.params["batch"]))
        if gate.listening:
            db.cur.execute(f"LISTEN {CHANNEL}")
        gate.arrive()
        while True:
            jobs = db.take()
            if jobs:
                for _id, payload in jobs:
                    gate.job_started(payload["key"])  # the (no-op) job body
                db.finish([j[0] for j in jobs])
                continue
            if not gate.listening or gate.stopping():
                break
            _wait_for_notify(db.conn, timeout_s=0.05)
        gate.ran()
        db.close()

    def verify_drain(self, url: str, jobs: int) -> DrainCheck:
        counts = dict(pg.execute(url, "SELECT state, count(*) FROM raw_job GROUP BY state"))
        return DrainCheck(counts.get("done", 0) == jobs and sum(counts.values()) == jobs, counts)

    def done_count(self, url: str) -> int:
        return int(pg.value(url, "SELECT count(*) FROM raw_job WHERE state = 'done'"))

    def open_producer(self, url: str) -> RawProducer:
        return RawProducer(url)

    def open_checkout_probe(self, url: str, case: CheckoutCase) -> RawCheckoutProbe:
        self.reset(url)
        ready = (
            "INSERT INTO raw_job (payload) "
            f"SELECT jsonb_build_object('key', g) FROM generate_series(1, {case.ready}) g"
        )
        if case.vacuumed:
            pg.execute(
                url,
                "INSERT INTO raw_job (state, not_before, payload) "
                "SELECT 'done', now() - interval '1 day', '{}' "
                f"FROM generate_series(1, {case.finished})",
                ready,
                "VACUUM ANALYZE raw_job",
                "CHECKPOINT",
            )
        else:
            pg.execute(
                url,
                "ALTER TABLE raw_job SET (autovacuum_enabled = false)",
                "INSERT INTO raw_job (not_before, payload) "
                "SELECT now() - interval '1 day' + g * interval '1 ms', '{}' "
                f"FROM generate_series(1, {case.finished}) g",
                "UPDATE raw_job SET state = 'done'",
                ready,
                "ANALYZE raw_job",
                "CHECKPOINT",
            )
        return RawCheckoutProbe(url)


def _wait_for_notify(conn: Any, timeout_s: float) -> None:
    """Block until a NOTIFY arrives (or timeout); a notify that came in during the
    last query is already in conn.notifies, so look there first."""
    if not conn.notifies:
        select.select([conn], [], [], timeout_s)
        conn.poll()
    conn.notifies.clear()
