"""The hot tables: the narrow tables every job passes through, and how far they may swell.

A job inserts a row into each of them and deletes it again (checkout, outcome), so they churn
at the rate of the queue while holding only the few rows of the work in flight. Their dead
rows and index entries are reclaimed by VACUUM alone; when autovacuum lags, each checkout
steps over more of them, and an index swollen by a backlog stays swollen after VACUUM. This
module is the one place that names them and says how far each may swell: the workers' upkeep
(``postjob_sa.worker.upkeep``) acts on it, ``postjob ps``, the dashboard and the metrics
report it, and ``bench/soak.py`` measures it. Indexes are not listed: every index of a hot
table is one (read from the catalog), so a table whose indexes change needs no change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

#: The tables every job inserts a row into and deletes it from (postjob.unfinished), and the
#: places and starts of limited queues, which every job of one updates.
HOT_TABLES = ("postjob.unfinished", "postjob.queue_slots", "postjob.queue_starts")
#: The job record: its ranges (the partitions of postjob.postjobs, each a relation here). Its
#: updates are HOT, so it needs no help to stay small, but the plans the workers' sessions
#: cache for it (generic plans, see postjob_sa/sql/) are made from its ranges' statistics: a
#: plan made while a range was small scans it whole until an ANALYZE comes.
RECORD_TABLE = "postjob.postjobs"

#: A hot table is vacuumed once it holds this many dead rows, plus DEAD_FRACTION of its live
#: ones (docs/operations.md, "Hot tables", says how these were measured).
DEAD_ROWS = 10_000
DEAD_FRACTION = 0.1
#: ... and once this many seconds have passed since its last VACUUM, if it holds any (the
#: rows a burst left when it ended, which no threshold would ever reach).
VACUUM_EVERY = 60.0
#: The upkeep vacuums nothing while a transaction older than this holds back what VACUUM
#: may remove (it could not, and would only read the tables again); it says which once.
HELD_BACK_AFTER = 60.0
#: An index is swollen, and rebuilt, once it is more than SWELL times the size a fresh index
#: of its table's live rows and DEAD_ROWS more would take, and at least MIN_SWOLLEN_BYTES.
SWELL = 8.0
MIN_SWOLLEN_BYTES = 1 << 20
#: The upkeep analyzes a table it vacuums when its statistics are older than this (seconds).
ANALYZE_EVERY = 600.0
#: The job record is analyzed once this many rows, plus ANALYZE_FRACTION of those it had at
#: its last ANALYZE, were written since (autovacuum's own rule, with its default fraction).
ANALYZE_ROWS = 10_000
ANALYZE_FRACTION = 1.0
#: autovacuum "has not visited" a swollen table when its last visit is older than this.
UNVISITED_SECONDS = 600.0

PAGE_BYTES = 8192
#: per page: the page header (and a B-tree page's special space); per row or entry: its
#: header, its line pointer and alignment, on average
_PAGE_OVERHEAD = {False: 24, True: 40}
_ROW_OVERHEAD = {False: 32, True: 16}
_DEFAULT_FILLFACTOR = {False: 100, True: 90}

#: One row per hot table and per index of one: its size, its table's live and dead rows and
#: vacuum history, whether this role owns it (only the owner may VACUUM or REINDEX it), and
#: the average width of what it stores (from pg_stats where ANALYZE left any, a NULL taking
#: nothing; 16 bytes for a variable-width column without). Reads the catalog and the statistics only: no table.
#: ``%(tables)s`` is HOT_TABLES; run on a worker's Conn or with exec_driver_sql.
HOT_RELATIONS_STATE = (
    "WITH hot AS ("
    "  SELECT t.oid AS table_oid, false AS is_record "
    "  FROM unnest(%(tables)s::text[]) AS h(name) JOIN pg_class t ON t.oid = to_regclass(h.name) "
    "  UNION ALL SELECT r.oid, true FROM pg_class r "
    "  WHERE r.oid = to_regclass(%(record)s) AND r.relkind = 'r' "
    "  UNION ALL SELECT i.inhrelid, true FROM pg_inherits i "
    "  WHERE i.inhparent = to_regclass(%(record)s)"
    "), rels AS ("
    "  SELECT table_oid, is_record, table_oid AS oid, false AS is_index, true AS valid FROM hot "
    "  UNION ALL "
    "  SELECT h.table_oid, false, i.indexrelid, true, i.indisvalid "
    "  FROM hot h JOIN pg_index i ON i.indrelid = h.table_oid WHERE NOT h.is_record"
    ") "
    "SELECT quote_ident(tn.nspname) || '.' || quote_ident(tc.relname) AS table_name, "
    "quote_ident(tn.nspname) || '.' || quote_ident(c.relname) AS relation, r.is_record, "
    "r.is_index, r.valid, "
    "pg_relation_size(r.oid) AS bytes, s.n_live_tup AS live_rows, s.n_dead_tup AS dead_rows, "
    "s.last_vacuum, s.last_autovacuum, "
    "GREATEST(s.last_analyze, s.last_autoanalyze) AS last_analyze, "
    "s.vacuum_count, s.autovacuum_count, s.n_mod_since_analyze AS changed_rows, "
    "s.n_tup_del + s.n_tup_upd - s.n_tup_hot_upd AS killed_rows, "
    "statement_timestamp() AS read_at, "
    "tc.reltuples::bigint AS analyzed_rows, "
    "pg_has_role(c.relowner, 'USAGE') AS owned, "
    "current_setting('autovacuum')::boolean AND current_setting('track_counts')::boolean "
    "AS autovacuum_on, "
    "COALESCE((SELECT o.option_value FROM pg_options_to_table(tc.reloptions) o "
    "  WHERE o.option_name = 'autovacuum_enabled'), 'on')::boolean AS autovacuum_enabled, "
    "COALESCE((SELECT o.option_value FROM pg_options_to_table(c.reloptions) o "
    "  WHERE o.option_name = 'fillfactor'), '0')::integer AS fillfactor, "
    "format('ALTER TABLE %%s RESET (autovacuum_enabled)', r.table_oid::regclass) "
    "AS autovacuum_reset, "
    "(SELECT COALESCE(sum((CASE WHEN a.attlen > 0 THEN a.attlen "
    "  ELSE COALESCE(st.avg_width, 16) END) * (1 - COALESCE(st.null_frac, 0))), 0) "
    "  FROM pg_attribute a "
    "  LEFT JOIN pg_stats st ON st.schemaname = tn.nspname AND st.tablename = tc.relname "
    "  AND st.attname = a.attname "
    "  WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped)::integer AS width "
    "FROM rels r JOIN pg_class c ON c.oid = r.oid "
    "JOIN pg_class tc ON tc.oid = r.table_oid JOIN pg_namespace tn ON tn.oid = tc.relnamespace "
    "JOIN pg_stat_user_tables s ON s.relid = r.table_oid "
    "ORDER BY table_name, r.is_index, relation"
)


@dataclass(frozen=True)
class Relation:
    """A hot table or an index of one, as HOT_RELATIONS_STATE read it."""

    table: str
    name: str
    is_record: bool
    is_index: bool
    valid: bool
    bytes: int
    live_rows: int
    dead_rows: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    vacuum_count: int
    autovacuum_count: int
    changed_rows: int
    killed_rows: int
    read_at: datetime
    analyzed_rows: int
    owned: bool
    #: the server's autovacuum (and the statistics it needs) is on
    autovacuum_on: bool
    #: the table's own storage parameter autovacuum_enabled
    autovacuum_enabled: bool
    fillfactor: int
    width: int
    #: the statement that gives its table autovacuum back
    autovacuum_reset: str

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> Relation:
        return cls(
            table=row["table_name"], name=row["relation"], is_record=bool(row["is_record"]),
            is_index=bool(row["is_index"]),
            valid=bool(row["valid"]), bytes=int(row["bytes"]),
            live_rows=int(row["live_rows"] or 0), dead_rows=int(row["dead_rows"] or 0),
            last_vacuum=row["last_vacuum"], last_autovacuum=row["last_autovacuum"],
            last_analyze=row["last_analyze"], vacuum_count=int(row["vacuum_count"] or 0),
            autovacuum_count=int(row["autovacuum_count"] or 0),
            changed_rows=int(row["changed_rows"] or 0),
            killed_rows=int(row["killed_rows"] or 0), read_at=row["read_at"],
            analyzed_rows=max(0, int(row["analyzed_rows"] or 0)), owned=bool(row["owned"]),
            autovacuum_on=bool(row["autovacuum_on"]),
            autovacuum_enabled=bool(row["autovacuum_enabled"]), fillfactor=int(row["fillfactor"]),
            width=int(row["width"]), autovacuum_reset=str(row["autovacuum_reset"]),
        )

    @property
    def autovacuum(self) -> bool:
        """Whether autovacuum may visit this relation's table."""
        return self.autovacuum_on and self.autovacuum_enabled

    @property
    def pages(self) -> int:
        return self.bytes // PAGE_BYTES

    def bytes_for(self, rows: int) -> int:
        """What a freshly built copy holding ``rows`` rows (entries) would take."""
        fill = (self.fillfactor or _DEFAULT_FILLFACTOR[self.is_index]) / 100
        per_page = max(1, int((PAGE_BYTES - _PAGE_OVERHEAD[self.is_index]) * fill
                              // (self.width + _ROW_OVERHEAD[self.is_index])))
        return (rows // per_page + 1) * PAGE_BYTES

    @property
    def vacuums(self) -> int:
        """Every VACUUM this table has had (autovacuum's and the others)."""
        return self.vacuum_count + self.autovacuum_count

    @property
    def vacuumed_ago(self) -> float | None:
        """Seconds since its last VACUUM (None: never)."""
        last = max((t for t in (self.last_vacuum, self.last_autovacuum) if t), default=None)
        return None if last is None else (self.read_at - last).total_seconds()

    @property
    def vacuum_due_at(self) -> int:
        """The dead rows at which the upkeep vacuums this relation's table."""
        return DEAD_ROWS + int(DEAD_FRACTION * self.live_rows)

    def needs_vacuum(self, dead_rows: int) -> bool:
        """Whether a hot table holding ``dead_rows`` is due: past its threshold, or holding
        any for longer than VACUUM_EVERY."""
        if self.is_index or self.is_record or dead_rows <= 0:
            return False
        ago = self.vacuumed_ago
        return dead_rows >= self.vacuum_due_at or ago is None or ago >= VACUUM_EVERY

    @property
    def needs_analyze(self) -> bool:
        """The job record's statistics are stale (plans cached from them may scan it)."""
        return self.is_record and self.changed_rows >= (
            ANALYZE_ROWS + ANALYZE_FRACTION * self.analyzed_rows)

    @property
    def capacity(self) -> int:
        """The most rows this table's pages could hold, twice what rows of the average width
        fill (rows vary): a bound on its live rows that statistics gone stale cannot break
        (the live count of pg_stat_user_tables is an estimate, and after a VACUUM that raced
        with deletes it can be off by the whole backlog)."""
        return 2 * self.pages * max(1, (PAGE_BYTES - _PAGE_OVERHEAD[False])
                                    // (self.width + _ROW_OVERHEAD[False]))

    @property
    def live_at_most(self) -> int:
        """The table's live rows as its statistics tell, bounded by what its pages hold."""
        return min(self.live_rows, self.capacity)

    def swollen_past(self, live_rows: int) -> int:
        """The size past which this relation is swollen, for a table of ``live_rows``: SWELL
        times what those rows and the dead rows of one vacuum cycle need."""
        return max(MIN_SWOLLEN_BYTES, int(SWELL * self.bytes_for(live_rows + DEAD_ROWS)))

    def swollen(self, live_rows: int) -> bool:
        """An index swollen past what ``live_rows`` need."""
        return self.is_index and self.valid and self.bytes > self.swollen_past(live_rows)

    def heap_swollen(self, live_rows: int) -> bool:
        """A hot table whose pages are swollen past what ``live_rows`` need (a backlog's: only
        a VACUUM that gives back the empty pages at its end shrinks it)."""
        return not (self.is_index or self.is_record) and self.bytes > self.swollen_past(live_rows)


#: The parameters of HOT_RELATIONS_STATE.
PARAMS = {"tables": list(HOT_TABLES), "record": RECORD_TABLE}


def read(conn: Connection) -> list[Relation]:
    """The hot tables' state, on a SQLAlchemy connection (ps, the dashboard, the metrics)."""
    return [Relation.of(r) for r in conn.exec_driver_sql(HOT_RELATIONS_STATE, PARAMS).mappings()]


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def warnings(relations: list[Relation]) -> list[str]:
    """What ``postjob ps``, ``ps top`` and the dashboard say about the hot tables, one line
    each, nothing when all is well: autovacuum off; a hot table holding more dead rows than
    the upkeep lets it hold, which autovacuum has not visited for UNVISITED_SECONDS; an index
    swollen past what its table's pages could hold (a backlog's, that nothing rebuilt)."""
    out: list[str] = []
    tables = {r.name: r for r in relations if not r.is_index}
    hot = [t for t in tables.values() if not t.is_record]
    if hot and not hot[0].autovacuum_on:
        out.append("autovacuum is off: only the workers' upkeep vacuums the hot tables (where "
                   "their role owns them), and nothing vacuums the job record; turn it on: "
                   "ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf()")
    else:
        out += [f"autovacuum is off for {t.name}: {t.autovacuum_reset}"
                for t in tables.values() if not t.autovacuum_enabled]
    for t in hot:
        if t.dead_rows < t.vacuum_due_at:
            continue
        last = t.last_autovacuum
        ago = None if last is None else (t.read_at - last).total_seconds()
        if ago is None or ago > UNVISITED_SECONDS:
            when = "ever" if ago is None else f"for {ago / 60:.0f} min"
            out.append(f"{t.name} holds {t.dead_rows:,} dead rows beside {t.live_rows:,} live "
                       f"ones and autovacuum has not visited it {when}: every checkout steps "
                       f"over them; as its owner: VACUUM (INDEX_CLEANUP ON) {t.name}, and see "
                       "why autovacuum lags (docs/operations.md, Hot tables)")
    for i in relations:
        table = tables.get(i.table)
        if table is not None and i.swollen(table.capacity):
            out.append(f"{i.name} is swollen: {size_text(i.bytes)}, where its table's rows "
                       f"need at most {size_text(i.bytes_for(table.capacity))}; as its owner: "
                       f"REINDEX INDEX CONCURRENTLY {i.name} (a running worker whose role "
                       "owns it does so itself)")
    return out
