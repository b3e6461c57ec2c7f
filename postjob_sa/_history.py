"""History: the ranges of job ids the record is partitioned by, and how long finished jobs
are kept (``JobQueue.set_history``, ``rotate_history``, ``history_status``; ``postjob
history``). The database does the work (``postjob_sa/sql/history.sql``); this module
validates the settings and turns its rows into reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from postjob_sa import _session_sql
from postjob_sa.errors import InvalidArgument

#: Job ids per range when nothing was set, the least and the most a range may hold.
DEFAULT_PARTITION_SIZE = 1_000_000
MIN_PARTITION_SIZE = 1_000
MAX_PARTITION_SIZE = 1_000_000_000
#: The longest keep (a century; the rotation takes a longer one stored by older code as this).
MAX_KEEP = timedelta(days=36_500)


@dataclass(frozen=True)
class HistorySettings:
    """How history is kept: ``keep`` (None: for ever) and ids per range."""

    keep: timedelta | None
    partition_size: int


@dataclass(frozen=True)
class HistoryRange:
    """One range of the record (``postjob history status``): its ids ``[from_id, to_id)``
    (None: open-ended; both None for the default partition), its jobs (counted, or as the
    statistics say for a large range), its bytes on disk, its newest settle as the rotation
    last read it, and the root of the unfinished tree that pins it."""

    name: str
    from_id: int | None
    to_id: int | None
    jobs: int
    bytes: int
    newest_settle: datetime | None
    pinned_by: int | None


#: What the rotation says when another one runs (then it does nothing).
ANOTHER_ROTATION = "another rotation runs"


@dataclass
class RotationReport:
    """What one rotation did: the ranges created (and the jobs moved there from the default
    partition), the ranges narrowed to the size set ``(name, its new end)``, the ranges
    dropped and their jobs, the range compacted (rewritten into full pages), the ranges kept
    because an unfinished tree (or a host's row) pins them, ``(name, root id or None,
    detail)``; ``busy`` when another rotation was running (then this one did nothing) or a
    lock was not had within 5 s, ``waited`` saying which, ``(range name or None for the
    record, detail)`` (the next rotation tries again); and the steps that failed, ``(name,
    error)`` (the other steps stand)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    compacted: list[str] = field(default_factory=list)
    jobs_dropped: int = 0
    jobs_moved: int = 0
    pinned: list[tuple[str, int | None, str | None]] = field(default_factory=list)
    busy: bool = False
    narrowed: list[tuple[str, int]] = field(default_factory=list)
    waited: list[tuple[str | None, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, rows: Sequence[Mapping[str, Any]]) -> RotationReport:
        report = cls()
        for row in rows:
            action, name = row["action"], row["name"]
            if action == "created":
                report.created.append(name)
                report.jobs_moved += int(row["jobs"])
            elif action == "narrowed":
                report.narrowed.append((name, int(row["to_id"])))
            elif action == "dropped":
                report.dropped.append(name)
                report.jobs_dropped += int(row["jobs"])
            elif action == "compacted":
                report.compacted.append(name)
            elif action == "pinned" and name not in [p[0] for p in report.pinned]:
                report.pinned.append((name, row["root_id"], row["detail"]))
            elif action == "busy":
                report.busy = True
                report.waited.append((name, str(row["detail"])))
            elif action == "failed":
                report.failed.append((name, str(row["detail"])))
        return report

    @property
    def did_something(self) -> bool:
        """Whether it changed a range, or has something to say (a lock not had, a failure)."""
        return bool(self.created or self.narrowed or self.dropped or self.compacted
                    or self.failed or [w for w in self.waited if w[1] != ANOTHER_ROTATION])

    def lines(self) -> list[str]:
        """The report in a few lines (what ``postjob history rotate`` prints)."""
        if self.waited and self.waited[0][1] == ANOTHER_ROTATION:
            return ["another rotation is running: nothing done"]
        out = [f"created {len(self.created)} range(s)" + (f": {', '.join(self.created)}"
                                                          if self.created else ""),
               f"dropped {len(self.dropped)} range(s), {self.jobs_dropped} job(s)"
               + (f": {', '.join(self.dropped)}" if self.dropped else "")]
        for name, to_id in self.narrowed:
            out.append(f"narrowed {name}: it ends before id {to_id:,}")
        if self.compacted:
            out.append(f"compacted {', '.join(self.compacted)}")
        for name, root, detail in self.pinned:
            out.append(f"kept {name}: " + (f"job tree {root} is unfinished" if root is not None
                                           else str(detail)))
        for where, detail in self.waited:
            out.append(f"busy ({where or 'the record'}), tried again at the next rotation: "
                       f"{detail}")
        for name, error in self.failed:
            out.append(f"failed {name}: {error}")
        return out


def checked(keep: timedelta | None, partition_size: int) -> HistorySettings:
    """The settings, or InvalidArgument before anything is written."""
    if keep is not None and (not isinstance(keep, timedelta) or keep <= timedelta(0)
                             or keep > MAX_KEEP):
        raise InvalidArgument(f"keep must be a positive timedelta of at most {MAX_KEEP.days:,} "
                              f"days (a century), or None (for ever), not {keep!r}")
    if (isinstance(partition_size, bool) or not isinstance(partition_size, int)
            or not MIN_PARTITION_SIZE <= partition_size <= MAX_PARTITION_SIZE):
        raise InvalidArgument(f"partition_size must be an integer of at least "
                              f"{MIN_PARTITION_SIZE:,} and at most {MAX_PARTITION_SIZE:,}, "
                              f"not {partition_size!r}")
    return HistorySettings(keep, partition_size)


def set_settings(session: Session, settings: HistorySettings) -> None:
    session.execute(_session_sql.HISTORY_SET, {"keep": settings.keep,
                                       "partition_size": settings.partition_size})


def settings(session: Session | Connection) -> HistorySettings:
    row = session.execute(_session_sql.HISTORY_SETTINGS).one()
    return HistorySettings(row.keep, int(row.partition_size))


def rotate(session: Session) -> RotationReport:
    level = session.execute(_session_sql.ISOLATION_LEVEL).scalar_one()
    if level != "read committed":
        raise InvalidArgument(f"rotate_history runs at READ COMMITTED (it decides on what it "
                              f"sees once its locks are granted), not {level.upper()}")
    return RotationReport.of([dict(r) for r in session.execute(_session_sql.HISTORY_ROTATE).mappings()])


def status(session: Session | Connection) -> list[HistoryRange]:
    return [HistoryRange(**dict(row)) for row in session.execute(_session_sql.HISTORY_STATUS).mappings()]
