"""README's "Status" must stay true as revisions are added and benchmarks rerun (issue 38,
item 10b): a range of revisions it names ends at the head this code ships, every revision it
names exists, and it quotes no throughput figures: those live, dated, in docs/performance.md,
which it links."""

from __future__ import annotations

import re

from postjob_sa._migrations import head_revision
from tests.docs.test_docs import ROOT


def _status() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Status\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def test_the_status_names_no_stale_revision_and_no_figures() -> None:
    status = _status()
    shipped = {p.name[:6] for p in (ROOT / "postjob_sa" / "alembic" / "versions").glob("pj*.py")}
    named = set(re.findall(r"\bpj\d{4}\b", status))
    assert named <= shipped, named - shipped
    for last in re.findall(r"\bpj\d{4}`? (?:to|through|up to|-|–) `?(pj\d{4})\b", status):
        assert last == head_revision(), f"README's Status ends its revisions at {last}, " \
            f"the head is {head_revision()}"
    figures = re.findall(r"[\d,.]+\s*(?:jobs/s|×|ms\b|µs)", status)
    assert not figures, f"figures belong in docs/performance.md, not README's Status: {figures}"
    assert "(docs/performance.md)" in status
