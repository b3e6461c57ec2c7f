"""The code shown in docs/workflows.md is code that runs: each block is part of
tests/doc_examples.py, and the examples run here."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests import doc_examples
from tests.wfutil import result, row

ROOT = Path(__file__).parents[2]


def test_every_python_block_of_the_page_is_in_the_examples_module() -> None:
    page = (ROOT / "docs" / "workflows.md").read_text()
    source = (ROOT / "tests" / "doc_examples.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.DOTALL)
    assert len(blocks) >= 3
    for block in blocks:
        compile(block, "<docs/workflows.md>", "exec")
        assert block in source, block[:200]


def test_album_fans_out(queue: JobQueue, session: Session) -> None:
    job = queue.enqueue(doc_examples.album, [3, 1, 2])
    session.commit()
    queue.drain()
    assert result(session, job.id) == ["thumb-3.png", "thumb-1.png", "thumb-2.png"]


def test_publish_waits_for_approval(queue: JobQueue, session: Session) -> None:
    doc_examples.SENT.clear()
    job = queue.enqueue(doc_examples.publish, 7)
    session.commit()
    queue.drain()
    assert row(session, job.id)["status"] == "sleep"
    (mail,) = doc_examples.SENT
    token = mail.rsplit(" ", 1)[1]
    queue.resolve(token, {"by": "ann"})
    session.commit()
    queue.drain()
    assert result(session, job.id) == "post 7 published, approved by ann"
    assert len(doc_examples.SENT) == 1  # the re-run found the step resolved: no second mail


def test_report_catches_failed_children(queue: JobQueue, session: Session) -> None:
    job = queue.enqueue(doc_examples.report, ["a", "b"])
    session.commit()
    deadline = 50
    while row(session, job.id)["status"] not in ("ok", "failed") and deadline:
        queue.drain()
        deadline -= 1
        session.execute(text("SELECT pg_sleep(0.02)"))
    assert result(session, job.id) == {"a": "unavailable (failed)", "b": "unavailable (failed)"}


def test_a_polite_workflow_waits_a_minute_after_its_first_failure(
    queue: JobQueue, session: Session
) -> None:
    from tests.doc_examples import polite

    assert polite.backoff is not None and polite.backoff(1) == 60.0 and polite.backoff(3) == 180.0
