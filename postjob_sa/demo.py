"""The workflows of ``postjob demo``: a fan-out/fan-in over a few children plus a manual
approval, small enough to read in one go.

``demo.report(words)`` spawns one ``demo.measure`` child per word and a manual approval
child, waits for all of them (sleeping in between, re-run from the top each time a child
finishes) and returns a summary. Run it yourself::

    postjob job enqueue demo.report '["a", "bb"]'
    postjob run --import postjob_sa.demo --count 4
    postjob ps full <id>        # the approval's token is in `postjob ps show <approval id>`
"""

from __future__ import annotations

from typing import Any

from postjob_sa.context import manual, set_workflow_status
from postjob_sa.registry import workflow

WORDS = ("postgres", "queue", "workflow", "restartable")


@workflow(name="demo.measure", max_attempts=3)
def measure(word: str) -> int:
    """A child: the length of one word."""
    return len(word)


@workflow(name="demo.report", timeout=3600)
def report(words: list[str]) -> dict[str, Any]:
    """The parent: measure every word (fan-out), wait for the results (fan-in) and for a
    person's approval, then summarise."""
    children = [measure.spawn(w) for w in words]  # created on the first run, found again later
    approval = manual("approve the report", len(words))
    set_workflow_status(f"measuring {len(words)} words")
    lengths = [c.result() for c in children]  # sleeps until each child is done
    set_workflow_status(f"waiting for approval: postjob job resolve {approval.token} RESULT")
    decision = approval.result()  # sleeps until someone resolves the token
    longest = max(zip(lengths, words, strict=True))[1] if words else None
    return {"words": len(words), "letters": sum(lengths), "longest": longest, "approval": decision}
