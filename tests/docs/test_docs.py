"""The docs cannot rot: every fenced code block in docs/*.md and README.md is run or checked.

How each block is treated, by its language (the word after the opening fence):

- ``python``: executed, in order, as one module per page (a doctest without the prompts).
  ``DATABASE_URL`` points at this module's test database, and ``JobQueue.work`` (and
  ``AsyncJobQueue.work``) drains instead
  of waiting forever, so "start a worker" examples terminate.
- ``text`` after ``<!-- docs-test: output -->``: must equal what the page's python blocks
  printed since the previous output block.
- ``sql``: executed against the test database, then rolled back.
- ``ini``: parsed; an ``[alembic]`` section must list our version location.
- ``sh``: every command must exist: ``make`` targets in the Makefile, ``python -m`` and
  ``flask --app`` modules importable, ``postjob`` subcommands in the CLI, ``-c`` files present.
- ``mermaid``: must not be empty (mkdocs renders it).

An HTML comment on the line before the fence changes the default:
``<!-- docs-test: compile -->`` compiles a python fragment without running it (for snippets
that only make sense inside a larger file, such as an env.py); ``<!-- docs-test: module NAME -->``
runs the page's python as module NAME (so a later block can ``import NAME``);
``<!-- docs-test: same-as PATH[:SECTION] -->`` says the block shows a file of the repository,
or the part of it between the lines ``# docs: begin SECTION`` and ``# docs: end SECTION``
(dedented), and must equal it: the code is tested where it lives, and the page shows it as
is wherever it is read (mkdocs, or GitHub, where include lines would show raw). Anywhere on
a page, ``<!-- docs-test: failures-expected -->`` allows its jobs to fail; otherwise a page
whose examples leave a job failed, erred or timed out fails.
"""

from __future__ import annotations

import configparser
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import URL, Engine, select
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import Job, Status
from tests.conftest import url_string

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

_MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
_INCLUDE = re.compile(r'^\s*--8<--\s+"')
# make targets that a sibling branch brings, and the file that defines them
_ARRIVING_TARGETS = {"bench": "bench/Makefile.inc", "bench-quick": "bench/Makefile.inc"}


@dataclass
class Block:
    page: Path
    line: int  # of the first line of code, 1-based
    lang: str
    code: str
    markers: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        markers = [mm[1] for mm in _MARKER.finditer(prev)]
        start = i + 1
        i = start
        while i < len(lines) and not lines[i].strip().startswith(fence):
            i += 1
        code = "\n".join(ln[indent:] for ln in lines[start:i]) + "\n"
        lang = (m["info"].split() or [""])[0].lower()
        found.append(Block(page, start + 1, lang, code, markers))
        i += 1
    return found


def page_markers(page: Path) -> list[str]:
    return [m[1] for m in _MARKER.finditer(page.read_text())]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# -- python, output, sql, ini, mermaid: run page by page ------------------------------------


def section(path: Path, name: str | None) -> str:
    """The file, or its part between ``# docs: begin NAME`` and ``# docs: end NAME``."""
    source = path.read_text()
    if name is None:
        return source
    lines = source.splitlines(keepends=True)
    marks = [i for i, ln in enumerate(lines) if ln.strip() in (f"# docs: begin {name}", f"# docs: end {name}")]
    assert len(marks) == 2, f"{path} has no section {name} (# docs: begin/end {name})"
    return textwrap.dedent("".join(lines[marks[0] + 1 : marks[1]]))


def check_same_as(block: Block) -> bool:
    """Compare a block marked ``same-as PATH[:SECTION]`` with what it shows; False if unmarked."""
    target = next((m.split(None, 1)[1] for m in block.markers if m.startswith("same-as ")), None)
    if target is None:
        return False
    name, _, part = target.partition(":")
    path = ROOT / name
    assert path.is_file(), f"{block.where}: shows {name}, which does not exist"
    expected = section(path, part or None)
    assert block.code.rstrip("\n") == expected.rstrip("\n"), (
        f"{block.where}: differs from {target}; paste it again:\n{expected}"
    )
    return True


class PageRun:
    """Runs one page's blocks in order, as one module."""

    def __init__(self, page: Path, engine: Engine):
        self.page = page
        self.engine = engine
        self.module: types.ModuleType | None = None
        self.stdout = io.StringIO()

    def module_for(self, block: Block) -> types.ModuleType:
        if self.module is None:
            name = next(
                (m.split(None, 1)[1] for m in block.markers if m.startswith("module ")),
                f"docs_{re.sub(r'[^a-z0-9]', '_', self.page.stem.lower())}",
            )
            self.module = types.ModuleType(name)
            self.module.__file__ = str(self.page)
            sys.modules[name] = self.module
        return self.module

    def python(self, block: Block, shown: bool) -> None:
        # pad so tracebacks point at the page's own line numbers
        code = compile("\n" * (block.line - 1) + block.code, str(self.page), "exec")
        if shown or "compile" in block.markers:
            return  # tested where it lives, or a fragment
        module = self.module_for(block)
        with contextlib.redirect_stdout(self.stdout):
            exec(code, module.__dict__)

    def output(self, block: Block) -> None:
        printed, self.stdout = self.stdout.getvalue(), io.StringIO()
        assert printed == block.code, f"{block.where}: the page's code printed\n{printed}"

    def sql(self, block: Block) -> None:
        with self.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            with dbapi.cursor() as cur:
                cur.execute(block.code)
            conn.rollback()

    def ini(self, block: Block) -> None:
        parser = configparser.ConfigParser(defaults={"here": "/app"})
        parser.read_string(block.code, source=block.where)
        if parser.has_section("alembic") and parser.has_option("alembic", "version_locations"):
            separator = parser.get("alembic", "path_separator", fallback="space")
            assert separator == "space", "the docs use space-separated version_locations"
            locations = parser.get("alembic", "version_locations").split()
            assert postjob_sa.VERSION_LOCATION in locations

    def run(self, block: Block) -> None:
        assert not any(_INCLUDE.match(ln) for ln in block.code.splitlines()), (
            f"{block.where}: an include line shows raw where people read the docs; paste the "
            "code and mark it <!-- docs-test: same-as PATH[:SECTION] -->"
        )
        shown = check_same_as(block)
        if block.lang in ("python", "py"):
            self.python(block, shown)
        elif block.lang == "text" and "output" in block.markers:
            self.output(block)
        elif block.lang == "sql":
            self.sql(block)
        elif block.lang == "ini":
            self.ini(block)
        elif block.lang in ("text", "mermaid"):
            assert block.code.strip(), f"{block.where}: an empty block"
        elif block.lang in ("sh", "bash", "console", "shell"):
            pass  # test_shell_commands_exist
        else:
            pytest.fail(f"{block.where}: no check for ```{block.lang} blocks (see this module)")

    def close(self) -> None:
        if self.module is None:
            return
        for value in list(vars(self.module).values()):
            if isinstance(value, Engine):
                value.dispose()
        sys.modules.pop(self.module.__name__, None)


@pytest.fixture
def docs_env(db_url: URL, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DATABASE_URL", url_string(db_url))

    def work(self: postjob_sa.JobQueue, count: int | None = None, **kwargs: object) -> int:
        return self.drain()  # a page's worker runs what it enqueued, then returns

    monkeypatch.setattr(postjob_sa.JobQueue, "work", work)

    async def work_async(self: postjob_sa.AsyncJobQueue, count: int | None = None, **kwargs: object) -> int:
        return await self.drain()

    monkeypatch.setattr(postjob_sa.AsyncJobQueue, "work", work_async)

    # every engine a page creates is disposed at the end, also one whose name a later block
    # reused (psycopg 3 warns of a pooled connection that is garbage-collected open)
    created: list[Engine] = []

    def create_engine(*args: Any, **kwargs: Any) -> Engine:
        created.append(real_create_engine(*args, **kwargs))
        return created[-1]

    real_create_engine = sqlalchemy.create_engine
    monkeypatch.setattr(sqlalchemy, "create_engine", create_engine)
    yield
    for eng in created:
        eng.dispose()


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_code_runs(page: Path, engine: Engine, clean: None, docs_env: None) -> None:
    run = PageRun(page, engine)
    try:
        for block in blocks(page):
            run.run(block)
    finally:
        run.close()
    leftover = run.stdout.getvalue()
    assert not leftover or "output" not in page_markers(page), f"unchecked output: {leftover}"
    if "failures-expected" not in page_markers(page):
        with Session(engine) as s:
            bad = s.scalars(
                select(Job).where(Job.status.in_([Status.err, Status.failed, Status.timeout]))
            ).all()
            assert not bad, [(j.id, j.workflow, j.status, j.error_message) for j in bad]


# -- shell commands --------------------------------------------------------------------------


def _commands() -> Iterator[tuple[Block, list[str]]]:
    for page in PAGES:
        for block in blocks(page):
            if block.lang not in ("sh", "bash", "console", "shell"):
                continue
            for line in block.code.splitlines():
                if block.lang == "console" and not line.startswith("$ "):
                    continue  # a console block shows output after its $ commands
                words = shlex.split(line.removeprefix("$ "), comments=True)
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                    words = words[1:]  # VAR=value prefixes
                if words:
                    yield block, words


COMMANDS = list(_commands())


def _make_targets(makefile: Path) -> set[str]:
    targets: set[str] = set()
    for line in makefile.read_text().splitlines():
        include = re.match(r"^-?include\s+(.+)$", line)
        if include:
            for name in include[1].split():
                if (ROOT / name).is_file():
                    targets |= _make_targets(ROOT / name)
            continue
        m = re.match(r"^([A-Za-z0-9_.\- ]+):(?!=)", line)
        if m:
            targets |= set(m[1].split())
    return targets


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _check_postjob(words: list[str]) -> None:
    try:
        cli = importlib.import_module("postjob_sa.cli")
    except ModuleNotFoundError:
        pytest.skip("postjob_sa.cli arrives with the CLI branch")
    import click

    group: click.Group = cli.cli
    command: click.Command = group
    ctx = click.Context(group)
    for word in words[1:]:
        if word.startswith("-") or not isinstance(command, click.Group):
            break
        sub = command.get_command(ctx, word)
        if sub is None:
            if command is group:
                pytest.fail(f"`postjob {word}` is not a command")
            break  # an argument of a group with a default command (`ps 12`)
        command = sub


@pytest.mark.parametrize(
    ("block", "words"), COMMANDS, ids=[f"{b.where} {' '.join(w[:3])}" for b, w in COMMANDS]
)
def test_shell_commands_exist(block: Block, words: list[str]) -> None:
    program, args = words[0], words[1:]
    if program == "make":
        targets = _make_targets(ROOT / "Makefile")
        for target in (a for a in args if not a.startswith("-") and "=" not in a):
            if target not in targets and not (ROOT / _ARRIVING_TARGETS.get(target, "Makefile")).exists():
                pytest.skip(f"`make {target}` arrives with {_ARRIVING_TARGETS[target]}")
            assert target in targets, f"{block.where}: no make target {target}"
    elif program in ("python", "python3") and args[:1] == ["-m"]:
        assert _module_exists(args[1]), f"{block.where}: no module {args[1]}"
    elif program == "flask":
        assert _module_exists(args[args.index("--app") + 1]), block.where
    elif program == "uvicorn":
        module, _, attr = args[0].partition(":")
        assert hasattr(importlib.import_module(module), attr), block.where
    elif program == "alembic":
        if "-c" in args:
            assert (ROOT / args[args.index("-c") + 1]).is_file(), block.where
    elif program == "postjob":
        _check_postjob(words)
    else:
        # commands of the outside world: nothing of ours to check
        assert program in ("pip", "export", "curl", "createdb", "psql", ".", "source"), (
            f"{block.where}: teach tests/docs/test_docs.py how to check `{program}`"
        )


# -- the API reference -----------------------------------------------------------------------


def test_api_reference_lists_every_public_name() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    main, _, rest = page.partition("## Our schema steps in your Alembic history")
    steps, _, helpers = rest.partition("## Testing helpers")
    listed = re.findall(r"^\s+- (\w+)$", main, re.M)
    assert sorted(listed) == sorted(n for n in postjob_sa.__all__ if n != "migrations")
    assert sorted(re.findall(r"^\s+- (\w+)$", steps, re.M)) == sorted(postjob_sa.migrations.__all__)
    from postjob_sa import testing

    public = [n for n in ("run_jobs", "enqueued", "run_jobs_async", "enqueued_async")
              if callable(getattr(testing, n, None))]
    assert sorted(re.findall(r"^\s+- (\w+)$", helpers, re.M)) == sorted(public)


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}" in nav, f"{page.name} is missing from mkdocs.yml's nav"



def test_a_shown_copy_that_drifted_fails(tmp_path: Path) -> None:
    page = ROOT / "docs" / "integrating.md"
    shown = section(ROOT / "examples/flask_app/models.py", "signup")

    def block(code: str, target: str) -> Block:
        return Block(page, 1, "python", code, [f"same-as {target}"])

    assert check_same_as(block(shown, "examples/flask_app/models.py:signup"))
    with pytest.raises(AssertionError, match="differs from"):
        check_same_as(block(shown.replace("320", "255"), "examples/flask_app/models.py:signup"))
    with pytest.raises(AssertionError, match="has no section nosuch"):
        check_same_as(block(shown, "examples/flask_app/models.py:nosuch"))
    with pytest.raises(AssertionError, match="does not exist"):
        check_same_as(block(shown, "examples/nosuch.py"))
    assert not check_same_as(Block(page, 1, "python", shown, []))
    include = Block(page, 1, "python", '--8<-- "examples/flask_app/models.py:signup"\n', [])
    with pytest.raises(AssertionError, match="include line shows raw"):
        PageRun(page, None).run(include)  # type: ignore[arg-type]
