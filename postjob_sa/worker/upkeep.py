"""The upkeep: a worker keeps the hot tables small when autovacuum does not.

One long-running worker of the fleet at a time keeps them: its upkeep duty (a thread and a
connection of its own, like the keeper's duties: the loop never waits for it) holds an
advisory lock for as long as its connection lives, and every :data:`INTERVAL` seconds reads
the state of the hot tables (``postjob_sa._hot_tables``: the statistics and the catalog,
never the tables) and repairs what has swollen, without blocking a checkout. The other
workers try the lock every :data:`FOLLOWER_INTERVAL` seconds, on a connection they close
again, so a fleet holds one connection for its upkeep and takes over within that time when
the worker holding it goes. The repairs:

* a table holding more dead rows than its threshold is vacuumed (``VACUUM (INDEX_CLEANUP
  ON)``, with ``ANALYZE`` when its statistics are old): it takes no lock that a checkout
  waits for, and its index cleanup is what removes the entries each checkout steps over;
* an index swollen past what its table's live rows need (a backlog leaves it so: VACUUM
  empties its pages but never returns them) is rebuilt with ``REINDEX INDEX CONCURRENTLY``,
  which lets writes go on while it builds the new index and swaps it in;
* what such a rebuild leaves behind when it is interrupted (an invalid ``…_ccnew`` index,
  which every insert would still maintain) is dropped, ``CONCURRENTLY``.

Every :data:`ROTATE_EVERY` seconds the same worker rotates history (``postjob.rotate_history``:
the ranges of job ids ahead are created, those past ``keep`` dropped), so nothing needs cron;
every :data:`FOLD_EVERY` seconds it folds the counts of jobs settled per minute
(``postjob.settled_counts``: one row per closed minute, queue and status) and drops those past
two hours.

Each repair is one log line. Only a table's owner may VACUUM or REINDEX it: a worker whose
role is not the owner says once per relation, in one line, what to run as the owner, and
repairs nothing. Workers behind a pooler in transaction mode (``pooled``), and those that run
until idle (``drain``, ``step``), have no upkeep.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from postjob_sa import _hot_tables as hot
from postjob_sa import _sql
from postjob_sa._db import Conn, sqlstate
from postjob_sa._history import RotationReport
from postjob_sa.worker.keeper import _Duty
from postjob_sa.worker.options import WorkerOptions

log = logging.getLogger("postjob_sa.upkeep")

#: Whether long-running workers keep the hot tables (a switch for benchmarks and tests).
ENABLED = True
#: Seconds between two looks at the hot tables, by the worker that holds the lock.
INTERVAL = 5.0
#: Seconds between two tries of the lock, by each of the others.
FOLLOWER_INTERVAL = 60.0
#: Seconds between two rotations of history (postjob_sa._history), by the worker that holds
#: the lock; the first comes with its first look.
ROTATE_EVERY = 300.0
#: Seconds between two folds of the per-minute counts of settled jobs (the dashboard's hour).
FOLD_EVERY = 60.0
#: After a repair failed, the relation is left alone this long.
RETRY_AFTER = 600.0

#: One upkeep at a time across every worker of the database: class 'pjup', key 1, held by
#: a session for as long as it lives (a connection lost releases it).
LOCK_TRY = "SELECT pg_try_advisory_lock(1886025072, 1)"
#: The repair statements, written by the server around a relation's name (a regclass: it
#: exists, and is quoted as it must be); no name from elsewhere reaches them.
#: VACUUM, with ANALYZE when asked, and without giving back the empty pages at the table's
#: end unless asked (that takes an ACCESS EXCLUSIVE lock, however briefly: a checkout would
#: wait for it; asked only of a table swollen past its live rows, after a backlog).
VACUUM_STATEMENT = (
    "SELECT format('VACUUM (INDEX_CLEANUP ON%%s%%s) %%s', "
    "CASE WHEN %(analyze)s THEN ', ANALYZE' ELSE '' END, "
    "CASE WHEN %(truncate)s THEN '' ELSE ', TRUNCATE false' END, %(name)s::regclass)")
ANALYZE_STATEMENT = "SELECT format('ANALYZE %%s', %(name)s::regclass)"
REINDEX_STATEMENT = "SELECT format('REINDEX INDEX CONCURRENTLY %%s', %(name)s::regclass)"
COUNT_STATEMENT = "SELECT format('SELECT count(*) FROM %%s', %(name)s::regclass)"
DROP_INDEX_STATEMENT = "SELECT format('DROP INDEX CONCURRENTLY %%s', %(name)s::regclass)"
#: Whether an index is being built on the table now (a REINDEX or CREATE INDEX of someone
#: else's, whose invalid index is not a leftover yet).
INDEX_BUILDS = ("SELECT count(*) FROM pg_stat_progress_create_index "
                "WHERE relid = %(table)s::regclass")
ROLE = "SELECT current_user"
#: The oldest transaction of this database that holds back what VACUUM may remove, if it is
#: older than %(seconds)s (the upkeep's own session aside).
HOLDING_BACK = (
    "SELECT pid, usename, application_name, state, xact_start, "
    "left(regexp_replace(query, '\\s+', ' ', 'g'), 80) AS query FROM pg_stat_activity "
    "WHERE datname = current_database() AND backend_xmin IS NOT NULL "
    "AND pid <> pg_backend_pid() "
    "AND xact_start < statement_timestamp() - make_interval(secs => %(seconds)s) "
    "ORDER BY xact_start LIMIT 1"
)
RELATION_SIZE = "SELECT pg_relation_size(%(name)s::regclass)"
#: The suffix REINDEX CONCURRENTLY gives the index it builds (…_ccnew, …_ccnew1, …).
LEFTOVER_MARK = "_ccnew"


class Upkeep:
    """The upkeep duty of one worker (see the module's docstring)."""

    def __init__(self, engine: Engine, options: WorkerOptions):
        self.enabled = ENABLED and not (options.until_idle or options.pooled)
        identifier = options.identifier
        self._next = time.monotonic() + INTERVAL * random.uniform(0.5, 1.0)
        self._next_rotation = 0.0
        self._next_fold = 0.0
        self._advised: set[str] = set()
        self._kills = _Kills()
        self._held_by: int | None = None  # the pid named as holding vacuum back
        self._failed: dict[str, float] = {}  # relation -> monotonic time to try again
        self._busy: Conn | None = None  # the connection of the statement running now
        self._leading: Conn | None = None  # the connection that holds the lock
        self._stopping = False
        self._busy_lock = threading.Lock()
        self._duty = _Duty("postjob-upkeep", engine, f"postjob upkeep {identifier}",
                           lambda: self._next - time.monotonic(), self._look_quietly,
                           pooled=False)

    def start(self) -> None:
        if self.enabled:
            self._duty.start()

    def stop(self) -> None:
        """Stop; a repair under way is cancelled (what it leaves is dropped by the next)."""
        with self._busy_lock:
            self._stopping = True
            busy = self._busy
        if busy is not None:
            try:
                busy.raw.cancel()
            except Exception:  # gone already: nothing to cancel
                pass
        self._duty.stop()

    def _look_quietly(self, conn: Conn) -> None:
        self.look(conn)  # its lines are logged already

    # -- one look ------------------------------------------------------------------------------

    def look(self, conn: Conn) -> list[str]:
        """If this worker holds the lock or gets it: read the hot tables' state and repair
        what has swollen. Returns the lines logged. A worker that does not get the lock closes
        ``conn`` (its duty opens another for the next try)."""
        if self._leading is not conn or conn.closed:
            self._leading = None
            if not conn.scalar(LOCK_TRY):
                self._next = time.monotonic() + FOLLOWER_INTERVAL
                conn.close()
                return []
            self._leading = conn
        self._next = time.monotonic() + INTERVAL
        lines = self._repair(conn)
        if time.monotonic() >= self._next_rotation:
            lines += self._rotate(conn)
        if time.monotonic() >= self._next_fold:
            lines += self._fold(conn)
        return lines

    def _fold(self, conn: Conn) -> list[str]:
        """Fold the closed minutes' counts of settled jobs: one statement, its own
        transaction, that waits for no row; a failure is one line, the next fold tries again."""
        self._next_fold = time.monotonic() + FOLD_EVERY
        try:
            conn.scalar(_sql.SETTLED_COUNTS_FOLD)
        except Exception as exc:  # logged; the upkeep goes on
            line = f"settled counts: fold failed: {exc}"
            log.warning(line)
            return [line]
        return []

    def _rotate(self, conn: Conn) -> list[str]:
        """Rotate history (create the ranges ahead, drop those past keep): one statement, its
        own transaction; a failure is one line, and the next rotation tries again."""
        self._next_rotation = time.monotonic() + ROTATE_EVERY
        try:
            report = RotationReport.of(conn.rows(_sql.HISTORY_ROTATE_SQL))
        except Exception as exc:  # logged; the upkeep goes on
            line = f"history rotation failed: {exc}"
            log.warning(line)
            return [line]
        if not report.did_something:
            return []
        line = "history: " + "; ".join(report.lines())
        (log.warning if report.failed else log.info)(line)
        return [line]

    def _repair(self, conn: Conn) -> list[str]:
        relations = [hot.Relation.of(r) for r in conn.rows(hot.HOT_RELATIONS_STATE, hot.PARAMS)]
        lines: list[str] = []
        for rel in relations:
            if rel.is_index and not rel.valid and LEFTOVER_MARK in rel.name:
                lines += self._drop_leftover(conn, rel)
        tables = {rel.name: rel for rel in relations if not rel.is_index}
        counted: dict[str, int] = {}

        def live(table: hot.Relation) -> int:  # counted once per look, when needed
            if table.name not in counted:
                counted[table.name] = int(conn.scalar(conn.scalar(
                    COUNT_STATEMENT, {"name": table.name})))
            return counted[table.name]

        held = None
        for rel in relations:
            dead = self._kills.since_vacuum(rel)
            if rel.needs_vacuum(dead):
                held = held or self._held_back(conn, lines)
                if held:
                    continue
                analyze = rel.last_analyze is None or (
                    (rel.read_at - rel.last_analyze).total_seconds() > hot.ANALYZE_EVERY)
                truncate = rel.heap_swollen(rel.live_at_most) and rel.heap_swollen(live(rel))
                self._kills.vacuuming(rel)
                lines += self._vacuum(conn, rel, dead, analyze, truncate)
            elif rel.needs_analyze:
                lines += self._analyze(conn, rel)
        for rel in relations:
            table = tables[rel.table]
            if rel.name in self._advised:
                continue  # said once what to run; nothing else to do here
            # so it seems from the statistics; counted, to be sure
            if rel.swollen(table.live_at_most) and rel.swollen(live(table)):
                lines += self._reindex(conn, rel, live(table))
        return lines

    def _drop_leftover(self, conn: Conn, rel: hot.Relation) -> list[str]:
        if int(conn.scalar(INDEX_BUILDS, {"table": rel.table})):
            return []  # being built now: not a leftover (yet)
        return self._act(conn, rel, DROP_INDEX_STATEMENT, lambda s: (
            f"upkeep: dropped {rel.name}, an invalid index an interrupted REINDEX "
            f"CONCURRENTLY left ({hot.size_text(rel.bytes)}), in {s:.2f} s"))

    def _held_back(self, conn: Conn, lines: list[str]) -> bool:
        """Whether an old transaction holds back what VACUUM may remove (said once per pid)."""
        rows = conn.rows(HOLDING_BACK, {"seconds": hot.HELD_BACK_AFTER})
        if not rows:
            self._held_by = None
            return False
        old = rows[0]
        if old["pid"] != self._held_by:
            self._held_by = old["pid"]
            line = (f"upkeep: the hot tables are not vacuumed while the transaction of pid "
                    f"{old['pid']} ({old['usename']}, {old['application_name'] or 'no name'}, "
                    f"{old['state']}, open since {old['xact_start'].isoformat(timespec='seconds')}"
                    f": {old['query']}) holds back what VACUUM may remove; end it with "
                    f"pg_terminate_backend({old['pid']}) if it is stuck")
            log.warning(line)
            lines.append(line)
        return True

    def _vacuum(self, conn: Conn, rel: hot.Relation, dead: int, analyze: bool,
                truncate: bool) -> list[str]:
        why = "autovacuum is off" if not rel.autovacuum else (
            "autovacuum last visited " + (rel.last_autovacuum.isoformat(timespec="seconds")
                                          if rel.last_autovacuum else "never"))
        done = " and analyzed it" if analyze else ""
        done += f", giving back its empty pages ({hot.size_text(rel.bytes)} before)" \
            if truncate else ""
        return self._act(conn, rel, VACUUM_STATEMENT, lambda s: (
            f"upkeep: vacuumed {rel.name}{done} in {s:.2f} s: "
            f"{dead:,} dead rows beside {rel.live_rows:,} live ones ({why})"),
            analyze=analyze, truncate=truncate)

    def _analyze(self, conn: Conn, rel: hot.Relation) -> list[str]:
        return self._act(conn, rel, ANALYZE_STATEMENT, lambda s: (
            f"upkeep: analyzed {rel.name} in {s:.2f} s: {rel.changed_rows:,} rows written "
            f"since its last ANALYZE, which counted {rel.analyzed_rows:,}"))

    def _reindex(self, conn: Conn, rel: hot.Relation, live_rows: int) -> list[str]:
        def done(seconds: float) -> str:
            after = conn.scalar(RELATION_SIZE, {"name": rel.name})
            return (f"upkeep: rebuilt {rel.name} concurrently in {seconds:.2f} s: "
                    f"{hot.size_text(rel.bytes)} -> {hot.size_text(int(after))} for {live_rows:,} live rows")
        return self._act(conn, rel, REINDEX_STATEMENT, done)

    def _act(self, conn: Conn, rel: hot.Relation, statement: str,
             report: Callable[[float], str], **params: object) -> list[str]:
        """Run one repair of ``rel`` (or say once what to run, when this role may not)."""
        if self._stopping or time.monotonic() < self._failed.get(rel.name, 0.0):
            return []
        repair = str(conn.scalar(statement, {"name": rel.name, **params}))
        if not rel.owned:
            return self._advise(conn, rel, repair)
        started = time.monotonic()
        try:
            with self._busy_lock:
                if self._stopping:  # stop() has come: it cancels only what started before
                    return []
                self._busy = conn
            conn.rows(repair)
        except Exception as exc:
            if sqlstate(exc) == "42501":  # insufficient privilege after all
                return self._advise(conn, rel, repair)
            if self._stopping:
                log.info("upkeep: %s interrupted: the worker stops", repair)
                return []
            self._failed[rel.name] = time.monotonic() + RETRY_AFTER
            line = (f"upkeep: {repair} failed (left alone for {RETRY_AFTER:.0f} s): "
                    + " ".join(str(exc).split())[:300])
            log.warning(line)
            return [line]
        finally:
            with self._busy_lock:
                self._busy = None
        line = report(time.monotonic() - started)
        log.info(line)
        return [line]

    def _advise(self, conn: Conn, rel: hot.Relation, repair: str) -> list[str]:
        if rel.name in self._advised:
            return []
        self._advised.add(rel.name)
        what = (f"is swollen ({hot.size_text(rel.bytes)})" if rel.is_index
                else f"holds {rel.dead_rows:,} dead rows")
        line = (f"upkeep: {rel.name} {what}, and this worker's role {conn.scalar(ROLE)} may "
                f"not repair it (only its owner may): run, as its owner: {repair}")
        log.warning(line)
        return [line]



class _Kills:
    """The rows a hot table's writes have killed since its last VACUUM, as one worker tells.

    pg_stat_user_tables counts them (n_dead_tup), but a VACUUM overwrites that count when it
    ends, losing the deletes committed while it ran: after a burst, a table can hold tens of
    thousands of dead rows that its count calls 300. The table's kill counter (deletes and
    non-HOT updates, which no VACUUM resets) does not lose them: after a VACUUM of its own,
    the upkeep counts from the counter's value when it began; after another session's, from
    the dead count it found then."""

    def __init__(self) -> None:
        self._since: dict[str, tuple[int, int]] = {}  # table -> (its vacuums, counter then)

    def since_vacuum(self, rel: hot.Relation) -> int:
        seen = self._since.get(rel.name)
        if seen is None or seen[0] != rel.vacuums:  # first look, or vacuumed by another
            seen = (rel.vacuums, rel.killed_rows - rel.dead_rows)
            self._since[rel.name] = seen
        return max(0, rel.killed_rows - seen[1])

    def vacuuming(self, rel: hot.Relation) -> None:
        """Our VACUUM of ``rel`` begins: it leaves what was killed after this look."""
        self._since[rel.name] = (rel.vacuums + 1, rel.killed_rows)
