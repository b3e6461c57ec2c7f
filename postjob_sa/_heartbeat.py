"""The heartbeat: extends the leases of the jobs a worker holds while it runs them."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Engine

from postjob_sa import _sql
from postjob_sa._connections import close_quietly, connect

log = logging.getLogger("postjob_sa.worker")


class Heartbeat:
    """A daemon thread that every lease/3 seconds extends the leases of the held jobs.

    It touches the database only while jobs are held longer than lease/3, so short jobs
    cost nothing.
    """

    def __init__(self, engine: Engine, lease: float):
        self._engine = engine
        self._lease = lease
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self.beats = 0

    def hold(self, leases: dict[int, int]) -> None:
        with self._lock:
            self._held.update(leases)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="postjob-heartbeat", daemon=True)
            self._thread.start()

    def release(self, ids: list[int]) -> None:
        with self._lock:
            for i in ids:
                self._held.pop(i, None)

    def _run(self) -> None:
        interval = self._lease / 3.0
        while not self._stop.wait(interval):
            with self._lock:
                held = dict(self._held)
            if held:
                self._beat(held)
        close_quietly(self._conn)

    def _beat(self, held: dict[int, int]) -> None:
        try:
            if self._conn is None:
                self._conn = connect(self._engine)
            with self._conn.cursor() as cur:
                cur.execute(
                    _sql.LEASE_EXTEND_DBAPI,
                    {"ids": list(held), "leases": list(held.values()), "lease": self._lease},
                )
                kept = cur.fetchone()[0]
            self.beats += 1
            if kept < len(held):
                log.warning("%d of %d running jobs lost their lease", len(held) - kept, len(held))
        except Exception as exc:
            log.warning("heartbeat failed: %s", " ".join(str(exc).split()))
            close_quietly(self._conn)
            self._conn = None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
