"""The state vocabulary is one Python enum (postjob_sa.Status) and one SQL type
(postjob.statuses): they agree, the state diagram of docs/workflows.md draws every state of
the enum and ends every final one, and the status lists the code writes out are the named
groups of the enum (a list that forgets 'cancelled' is caught here)."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import Engine, text

from postjob_sa import Status
from postjob_sa.models import FINAL_STATUSES

ROOT = Path(__file__).resolve().parents[2]
DIAGRAM = re.compile(r"```mermaid\n(stateDiagram-v2\n.*?)```", re.S)
EDGE = re.compile(r"^\s*(\[\*\]|\w+) --> (\[\*\]|\w+)", re.M)

UNFINISHED = frozenset(Status) - FINAL_STATUSES
#: The groups a status list in the code may be (as sets), each derived from the enum.
GROUPS = {
    "final": FINAL_STATUSES,
    "unfinished": UNFINISHED,
    "waiting (postjob.unfinished's)": UNFINISHED - {Status.processing},
    "runnable": frozenset({Status.ready, Status.err}),
    "ended badly": FINAL_STATUSES - {Status.ok},
    "a run's own end": frozenset({Status.ok, Status.failed}),
}
#: Where status lists are written: the live SQL and the package's Python (history is history).
SOURCES = [*sorted((ROOT / "postjob_sa" / "sql").glob("*.sql")),
           *sorted(p for p in (ROOT / "postjob_sa").rglob("*.py") if "alembic" not in p.parts)]
STATUS_LIST = re.compile(r"status(?:::text)?\s+(?:NOT\s+)?IN\s*\(((?:\s*'\w+'\s*,?)+)\)", re.I)


def test_the_enum_and_the_sql_type_agree(engine: Engine) -> None:
    with engine.connect() as conn:
        labels = conn.execute(text(
            "SELECT enumlabel FROM pg_enum WHERE enumtypid = 'postjob.statuses'::regtype "
            "ORDER BY enumsortorder")).scalars().all()
    assert labels == [s.value for s in Status]


def test_the_state_diagram_draws_every_state_of_the_enum() -> None:
    page = (ROOT / "docs" / "workflows.md").read_text()
    (diagram,) = DIAGRAM.findall(page)
    edges = EDGE.findall(diagram)
    states = {s for edge in edges for s in edge} - {"[*]"}
    assert states == {s.value for s in Status}
    ends = {a for a, b in edges if b == "[*]"}
    assert ends == {s.value for s in FINAL_STATUSES}
    leaves = {a for a, b in edges if b != "[*]"}
    assert {s.value for s in UNFINISHED} <= leaves  # every unfinished state goes somewhere


def test_every_status_list_in_the_code_is_a_group_of_the_enum() -> None:
    stray = []
    for path in SOURCES:
        for match in STATUS_LIST.finditer(path.read_text()):
            names = frozenset(Status(n) for n in re.findall(r"'(\w+)'", match.group(1)))
            if len(names) > 1 and names not in GROUPS.values():
                stray.append(f"{path.relative_to(ROOT)}: {sorted(s.value for s in names)}")
    assert not stray, stray
