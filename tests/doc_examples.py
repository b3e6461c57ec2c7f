"""The example workflows of docs/workflows.md, verbatim (tests/workflows/test_doc_examples.py
runs them and checks that every code block of the page is a piece of this file)."""

from __future__ import annotations

from typing import Any

import postjob_sa
from postjob_sa import ChildFailed, workflow

SENT: list[str] = []  # stands in for an e-mail gateway


def send_email(to: str, text: str) -> None:
    SENT.append(f"{to}: {text}")


# --- example: fan-out ---
@workflow(name="docs.thumbnail")
def thumbnail(image_id: int) -> str:
    return f"thumb-{image_id}.png"


@workflow(name="docs.album")
def album(image_ids: list[int]) -> list[str]:
    postjob_sa.set_workflow_status(f"{len(image_ids)} thumbnails")
    children = [thumbnail.spawn(i) for i in image_ids]  # found again on every re-run
    return [c.result() for c in children]  # sleeps until each is done, in order
# --- end ---


# --- example: manual step ---
@workflow(name="docs.publish")
def publish(post_id: int) -> str:
    approval = postjob_sa.manual("approve post", post_id, timeout=7 * 24 * 3600)
    if approval.status == postjob_sa.Status.ready:
        # Runs again on every re-run before the step is resolved: make it idempotent
        # in real code (e.g. remember in your own table that the mail went out).
        send_email("editor@example.com", f"approve with token {approval.token}")
    decision = approval.result()  # sleeps until JobQueue.resolve(token, ...)
    return f"post {post_id} published, approved by {decision['by']}"
# --- end ---


# --- example: a back-off of the workflow's own ---
@workflow(name="docs.polite", max_attempts=4, backoff=lambda attempt: 60.0 * attempt)
def polite(url: str) -> str:  # retried after 1, 2, then 3 minutes
    return url


# --- example: catching a failed child ---
@workflow(name="docs.flaky_source", max_attempts=2)
def flaky_source(url: str) -> str:
    raise ConnectionError(f"{url} is down")


@workflow(name="docs.report")
def report(urls: list[str]) -> dict[str, Any]:
    sources = {u: flaky_source.spawn(u) for u in urls}
    out: dict[str, Any] = {}
    for url, child in sources.items():
        try:
            out[url] = child.result()
        except ChildFailed as exc:  # handled here, whenever it failed: carry on without it
            out[url] = f"unavailable ({exc.status})"
    return out
# --- end ---
