"""The SQL files of the package, as the revisions install them.

``postjob_sa/sql/`` holds the schema as it is now: ``schema.sql`` (tables, indexes, triggers;
a test compares it with a migrated database) and one file of functions per concern.
``postjob_sa/sql/history/`` holds frozen copies: what a revision installed, kept when a later
revision changes the live file (the older revision then reads its copy, so it installs exactly
what it installed; a test records each revision's offline SQL).
"""

from __future__ import annotations

from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
HISTORY_DIR = SQL_DIR / "history"

#: The function files, in the order they are installed (a LANGUAGE sql body is checked when it
#: is created, so what it calls comes first; plpgsql bodies are checked when they run).
FUNCTION_FILES = ("jobs", "checkout", "workflows", "outcomes", "leases", "operators", "limits",
                  "schedules", "durable", "compat")


def live(name: str) -> str:
    """The text of the live file ``postjob_sa/sql/<name>.sql``."""
    return (SQL_DIR / f"{name}.sql").read_text()


def frozen(name: str) -> str:
    """The text of the frozen copy ``postjob_sa/sql/history/<name>.sql``."""
    return (HISTORY_DIR / f"{name}.sql").read_text()


def live_functions() -> list[str]:
    """Every live function file's text, in :data:`FUNCTION_FILES` order."""
    return [live(name) for name in FUNCTION_FILES]
