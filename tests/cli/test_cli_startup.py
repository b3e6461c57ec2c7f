"""``postjob`` starts fast: ``--help`` and ``ps`` import only what they use (Alembic alone was
about a second of ``postjob --help`` on a busy machine). What each path imports is asserted in a
fresh interpreter, never a timing, so the guard holds on a loaded machine too."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from sqlalchemy import URL

import postjob_sa
from postjob_sa import cli
from tests.conftest import url_string

#: Heavy modules, none of which the paths below need.
HEAVY = ("alembic", "prometheus_client", "postjob_sa.worker.loop", "postjob_sa.queue",
         "sqlalchemy.ext.asyncio", "postjob_sa.web", "rich")


def _imported_after(code: str) -> list[str]:
    """The HEAVY modules present after running ``code`` in a fresh interpreter."""
    probe = (f"import sys\n{code}\n"
             f"print(__import__('json').dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout.splitlines()[-1]))


def _cli(*argv: str) -> str:
    return ("from postjob_sa.cli import main\n"
            f"try:\n    main({list(argv)!r})\nexcept SystemExit:\n    pass")


def test_import_postjob_sa_imports_nothing_heavy() -> None:
    assert _imported_after("import postjob_sa") == []


def test_postjob_help_imports_no_command() -> None:
    assert _imported_after(_cli("--help")) == []


def test_postjob_ps_imports_neither_alembic_nor_the_worker(db_url: URL) -> None:
    assert set(_imported_after(_cli("--database-url", url_string(db_url), "ps"))) <= {"rich"}


def test_every_public_name_is_the_one_its_module_defines() -> None:
    for name in postjob_sa.__all__:
        value = getattr(postjob_sa, name)
        if name == "migrations":
            assert value is sys.modules["postjob_sa.migrations"]
        else:
            assert value is getattr(sys.modules[f"postjob_sa.{postjob_sa._HOMES[name]}"], name)
    assert set(postjob_sa.__all__) <= set(dir(postjob_sa))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        postjob_sa.nope  # noqa: B018


def test_a_submodule_is_an_attribute_of_the_package_before_anyone_imports_it() -> None:
    """``postjob_sa.registry.default_registry`` worked while the package imported everything;
    the lazy names must not break it (the bench's adapter did exactly this)."""
    code = ("import postjob_sa\n"
            "assert postjob_sa.registry.default_registry is not None\n"
            "assert postjob_sa.models.Job.__tablename__ == 'postjobs'\n"
            "assert postjob_sa.errors.InvalidArgument is postjob_sa.InvalidArgument\n")
    assert _imported_after(code) == []


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_the_help_summaries_are_the_commands_own(name: str) -> None:
    command = cli.cli.get_command(click.Context(cli.cli), name)
    assert command is not None and command.name == name
    assert cli.COMMANDS[name].summary == command.get_short_help_str(1000)
