"""A long transaction elsewhere (idle in transaction, REPEATABLE READ, holding the snapshot of
a read for 30 s) does not stop the workers: dead row versions it keeps alive slow the queue
down, they must not stall it. Throughput is measured without it, during it and after it."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for, wait_listening

BATCH = 1500
HOLD = 30.0


def _batch(engine: Engine, size: int = BATCH) -> float:
    """Enqueue ``size`` jobs at once; jobs per second until all are ok."""
    with Session(engine) as s:
        ids = JobQueue(s).enqueue_many("rel.record", [[k] for k in range(size)])
        s.commit()
    started = time.monotonic()
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok' "
                                    "AND id BETWEEN :a AND :b", a=ids[0], b=ids[-1]) == size,
             HOLD, f"a batch of {size} jobs ok", interval=0.05)
    return size / (time.monotonic() - started)


def test_an_idle_in_transaction_snapshot_slows_but_does_not_stop_the_workers(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    procs = [workers(db_url) for _ in range(2)]
    wait_listening(engine, 2, procs)
    _batch(engine)  # warm-up: connections, prepared statements, caches
    without = _batch(engine)
    # batches of about 2 s at the rate measured without the snapshot: several fit in its 30 s
    # on a fast machine and on a loaded one alike
    size = max(100, min(BATCH, int(without * 2)))

    holder = engine.connect()
    during: list[float] = []
    try:
        holder.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        holder.execute(text("SELECT count(*) FROM postjob.jobs")).scalar()
        began = time.monotonic()
        state, xmin = scalar(engine, "SELECT array[state, backend_xmin::text] FROM "
                                     "pg_stat_activity WHERE pid = :p",
                             p=holder.execute(text("SELECT pg_backend_pid()")).scalar())
        assert state == "idle in transaction" and xmin is not None
        # batches for as long as the snapshot is held (the last one may end a bit after)
        while time.monotonic() - began < HOLD - 2 * (size / (during[-1] if during else without)):
            during.append(_batch(engine, size))
        time.sleep(max(0.0, HOLD - (time.monotonic() - began)))
        held = time.monotonic() - began
    finally:
        holder.rollback()
        holder.close()
    after = _batch(engine)

    for p in procs:
        assert p.alive(), p.log()
    assert len(during) >= 3, during
    mean_during = sum(during) / len(during)
    # slower is expected (dead index entries the snapshot pins); stalled is the failure
    assert min(during) >= without / 10, (without, during)
    report(f"long transaction: {without:.0f} jobs/s without; {mean_during:.0f} jobs/s on "
           f"average during a {held:.0f} s REPEATABLE READ snapshot (batches: "
           f"{', '.join(f'{d:.0f}' for d in during)}); {after:.0f} jobs/s after it ended")
