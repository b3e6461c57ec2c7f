"""The workflow registry: one function per name (a collision names both), a function
registered again (a module reloaded) replaces itself, and a workflow defined in a script run
directly warns that workers will not know it by that name."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import postjob_sa
from postjob_sa import InvalidArgument, Registry


def _send_in(module: str) -> Callable[[], str]:
    """A function ``send`` that lives in ``module`` (as billing.send and mail.send would)."""

    def send() -> str:
        return module

    send.__module__ = module
    send.__qualname__ = "send"
    return send


def test_two_functions_under_one_name_are_refused_naming_both() -> None:
    reg = Registry()
    billing = postjob_sa.workflow(name="send", registry=reg)(_send_in("billing"))
    with pytest.raises(InvalidArgument) as caught:
        postjob_sa.workflow(name="send", registry=reg)(_send_in("mail"))
    assert str(caught.value) == (
        "workflow name 'send' is taken by billing.send: mail.send cannot be registered under it "
        "too; give one of them another name (@postjob_sa.workflow(name=...))"
    )
    assert reg.get("send") is billing  # the first one stays


def test_two_functions_of_different_qualnames_under_one_name_are_refused() -> None:
    reg = Registry()
    postjob_sa.workflow(name="notify", registry=reg)(lambda: 1)

    def other() -> int:
        return 2

    with pytest.raises(InvalidArgument, match=r"taken by .*<lambda>: .*other cannot be registered"):
        postjob_sa.workflow(name="notify", registry=reg)(other)


def test_the_same_function_registered_again_replaces_itself() -> None:
    """A module reloaded (importlib.reload, a dev server) defines its functions anew."""
    reg = Registry()
    postjob_sa.workflow(name="send", registry=reg)(_send_in("billing"))
    reloaded = postjob_sa.workflow(name="send", registry=reg, max_attempts=2)(_send_in("billing"))
    assert reg.get("send") is reloaded
    default_named = postjob_sa.workflow(registry=reg)(_send_in("billing"))
    assert default_named.name == "billing.send"
    assert postjob_sa.workflow(registry=reg)(_send_in("billing")).name == "billing.send"


SCRIPT = """
import postjob_sa

@postjob_sa.workflow(registry=postjob_sa.Registry())
def ping() -> str:
    return "pong"

@postjob_sa.workflow(name="named", registry=postjob_sa.Registry())
def named() -> str:
    return "fine"
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "tasks.py").write_text(SCRIPT)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_workflow_in_a_script_run_directly_warns_with_the_fix(tmp_path: Path) -> None:
    res = _run(tmp_path, "tasks.py")
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        f"{tmp_path / 'tasks.py'}:4: UserWarning: workflow '__main__.ping' is defined in a script "
        "run directly, and its jobs are stored under that name: a worker that imports the script "
        "(postjob run --import tasks) knows it as 'tasks.ping' and never runs them. Name it, "
        "@postjob_sa.workflow(name='ping'), or define it in a module you import",
        "  @postjob_sa.workflow(registry=postjob_sa.Registry())",
    ]  # one warning: the named workflow is fine
    res = _run(tmp_path, "-c", "import tasks")  # imported, as a worker does: no warning
    assert res.returncode == 0 and res.stderr == ""
