"""Job args and results are stored and shown in clear; a dashboard can hide them
(``create_app(show_args=False)``) or show what a callable of the host makes of each value
(``create_app(redact=fn)``): on a job's page (args, result, durable steps, the tree), in the
jobs list, in the overview's manual steps, and in the live fragments (issue 38, item 10d)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from werkzeug.test import Client

import postjob_sa
from postjob_sa import InvalidArgument, JobQueue
from postjob_sa.testing import run_jobs
from postjob_sa.web import create_app

SECRET = "4242-4242-4242-4242"
MASK = "****"


@postjob_sa.workflow(name="tests.web.redact.charge")
def charge(order: dict[str, Any]) -> dict[str, Any]:
    receipt = postjob_sa.step("charge", lambda: {"card": order["card"], "amount": order["amount"]})
    return {"card": order["card"], "receipt": receipt}


@postjob_sa.workflow(name="tests.web.redact.refund")
def refund(order: dict[str, Any]) -> Any:
    charge.spawn(order).result()
    return postjob_sa.manual(f"refund card {order['card']}", order).result()


def mask(value: Any) -> Any:
    """The host's redaction: every card number masked, the rest kept."""
    if isinstance(value, dict):
        return {k: MASK if k == "card" else mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value.replace(SECRET, MASK) if isinstance(value, str) else value


@pytest.fixture
def jobs(engine: Engine, clean: None) -> tuple[int, int]:
    with Session(engine) as s:
        root = JobQueue(s).enqueue(refund, {"card": SECRET, "amount": 1299}).id
        run_jobs(s)
    with engine.connect() as conn:
        child = conn.execute(text("SELECT id FROM postjob.jobs WHERE workflow = :w"),
                             {"w": charge.name}).scalar_one()
        status = conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                              {"i": child}).scalar_one()
    assert status == "ok"
    return root, child


def pages(client: Client, root: int, child: int) -> dict[str, str]:
    paths = ["/", "/jobs", f"/jobs?workflow={charge.name}", f"/jobs/{root}", f"/jobs/{child}"]
    out = {}
    for path in paths:
        for live in ("", "&live=1" if "?" in path else "?live=1"):
            response = client.get(path + live)
            assert response.status_code == 200, (path + live, response.status_code)
            out[path + live] = response.get_data(as_text=True)
    return out


def test_by_default_args_and_results_are_shown_in_clear(engine: Engine, jobs: tuple[int, int]) -> None:
    shown = pages(Client(create_app(engine)), *jobs)
    for path in ("/", "/jobs", f"/jobs/{jobs[0]}", f"/jobs/{jobs[1]}"):
        assert SECRET in shown[path], path


def test_show_args_false_hides_args_and_results_everywhere(engine: Engine, jobs: tuple[int, int]) -> None:
    shown = pages(Client(create_app(engine, show_args=False)), *jobs)
    for path, page in shown.items():
        assert SECRET not in page and "1299" not in page, path
    job = shown[f"/jobs/{jobs[1]}"]
    assert "args hidden" in job and "result hidden" in job
    assert "charge" in job  # the step is listed, its result is not


def test_redact_shows_what_the_callable_returns_for_each_value(
        engine: Engine, jobs: tuple[int, int]) -> None:
    seen: list[Any] = []

    def redact(value: Any) -> Any:
        seen.append(value)
        return mask(value)

    shown = pages(Client(create_app(engine, redact=redact)), *jobs)
    for path, page in shown.items():
        assert SECRET not in page, path
    assert {"card": SECRET, "amount": 1299} in [v[0] for v in seen if isinstance(v, list) and v]
    assert {"card": SECRET, "amount": 1299} in seen  # the step's result, a value of its own
    child = shown[f"/jobs/{jobs[1]}"]
    assert MASK in child and "1299" in child  # masked, and the rest kept
    assert MASK in shown["/jobs"] and MASK in shown[f"/jobs/{jobs[0]}"]
    assert f"refund card {MASK}" in shown["/"]  # the manual step's label is an arg too


def test_a_redact_that_fails_hides_the_value(engine: Engine, jobs: tuple[int, int]) -> None:
    def broken(value: Any) -> Any:
        raise KeyError("card")

    shown = pages(Client(create_app(engine, redact=broken)), *jobs)
    for path, page in shown.items():
        assert SECRET not in page, path
    assert "hidden (redact raised KeyError)" in shown[f"/jobs/{jobs[1]}"]


def test_create_app_refuses_a_redact_that_is_not_callable_or_contradicts(engine: Engine) -> None:
    with pytest.raises(InvalidArgument, match="redact"):
        create_app(engine, redact="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="redact"):
        create_app(engine, show_args=False, redact=mask)
