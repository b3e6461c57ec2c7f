"""The SQL files of the package, as the revisions install them.

``postjob_sa/sql/`` holds the schema as it is now: ``schema.sql`` (tables, indexes, triggers;
a test compares it with a migrated database) and one file of functions per concern.
``postjob_sa/sql/history/<revision>/`` holds a revision's frozen copy of the function files:
what it installed, kept once a later revision changed a live file (so the earlier revision
keeps installing exactly what it installed; a test records each revision's offline SQL).
``postjob_sa/sql/retire/<release>.sql`` drops what is kept for a release's code, written
ahead for the revision that stops serving it. ``postjob_sa/sql/README.md`` is the recipe.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
HISTORY_DIR = SQL_DIR / "history"
RETIRE_DIR = SQL_DIR / "retire"

#: The revision that installs the live function files (every earlier one installs its frozen
#: copy; the freeze recipe moves this on: postjob_sa/sql/README.md).
LIVE_REVISION = "pj0011"

#: The live function files, in the order they are installed (a LANGUAGE sql body is checked
#: when it is created, so what it calls comes first; plpgsql bodies are checked when they run).
FUNCTION_FILES = ("jobs", "checkout", "counted", "workflows", "outcomes", "leases", "operators",
                  "limits", "schedules", "durable", "history", "compat")


def live(name: str) -> str:
    """The text of the live file ``postjob_sa/sql/<name>.sql``."""
    return (SQL_DIR / f"{name}.sql").read_text()


def frozen(name: str) -> str:
    """The text of the frozen copy ``postjob_sa/sql/history/<name>.sql``."""
    return (HISTORY_DIR / f"{name}.sql").read_text()


def retire(release: str) -> str:
    """What the revision that stops serving ``release``'s code drops."""
    return (RETIRE_DIR / f"{release}.sql").read_text()


def functions(revision: str) -> list[str]:
    """The function files ``revision`` installs: the live files for :data:`LIVE_REVISION`,
    its frozen copy (every file it read, frozen together) for an earlier one. A frozen copy
    that is missing (a package built without it) is an error, never the live files."""
    if revision == LIVE_REVISION:
        return [live(name) for name in FUNCTION_FILES]
    folder = HISTORY_DIR / revision
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: the frozen function files of {revision} are missing")
    names = [p.stem for p in folder.glob("*.sql")]
    order = {name: i for i, name in enumerate(FUNCTION_FILES)}
    names.sort(key=lambda n: (order.get(n, len(order)), n))
    return [(folder / f"{name}.sql").read_text() for name in names]


def live_functions() -> list[str]:
    """Every live function file's text, in :data:`FUNCTION_FILES` order."""
    return [live(name) for name in FUNCTION_FILES]


def freeze(revision: str) -> Path:
    """Copy the live function files into ``history/<revision>/`` (before a change to any of
    them: the revision that installed them keeps installing what it did); then point
    :data:`LIVE_REVISION` at the new revision."""
    folder = HISTORY_DIR / revision
    if folder.exists():
        raise SystemExit(f"{folder} exists already: {revision} is frozen")
    folder.mkdir(parents=True)
    for name in FUNCTION_FILES:
        shutil.copyfile(SQL_DIR / f"{name}.sql", folder / f"{name}.sql")
    return folder


if __name__ == "__main__":  # python -m postjob_sa.alembic._sql_files freeze pj0009
    if len(sys.argv) != 3 or sys.argv[1] != "freeze":
        raise SystemExit("usage: python -m postjob_sa.alembic._sql_files freeze REVISION")
    print(f"froze the function files into {freeze(sys.argv[2])}")
