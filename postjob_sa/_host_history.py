"""A host's own Alembic history, the single-head way: which of our revisions its revisions
apply (read from their source, so no database is needed), and writing the next such revision
with Alembic's own machinery (their template, their head as down_revision, their hooks)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postjob_sa import _alembic_quiet  # noqa: F401  (first: Alembic imported quietly)

# isort: split
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import rev_id as new_rev_id

from postjob_sa._migrations import VERSION_LOCATION, VERSIONS_DIR, head_revision, revisions
from postjob_sa.errors import InvalidArgument

IMPORT = "from postjob_sa import migrations"


def _names_migrations(node: ast.expr) -> bool:
    """``migrations`` or ``<anything>.migrations``."""
    if isinstance(node, ast.Name):
        return node.id == "migrations"
    return isinstance(node, ast.Attribute) and node.attr == "migrations"


def _order(rev: str) -> int:
    return revisions().index(rev)


def upgrade_target(path: Path) -> str | None:
    """The revision that ``migrations.upgrade(...)`` names in a revision file of the host,
    or None if the file does not call it."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "upgrade" and _names_migrations(node.func.value)):
            continue
        args = [k.value for k in node.keywords if k.arg == "to"] or node.args[:1]
        if not (args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)):
            raise InvalidArgument(
                f"{path}:{node.lineno}: migrations.upgrade() must name its revision as a "
                'string, e.g. migrations.upgrade(to="pj0001")'
            )
        if args[0].value not in revisions():
            raise InvalidArgument(
                f"{path}:{node.lineno}: migrations.upgrade(to={args[0].value!r}) names a "
                f"revision this postjob_sa does not have ({', '.join(revisions())}): upgrade postjob_sa"
            )
        found.append(args[0].value)
    return max(found, key=_order) if found else None


def applied(script_dir: ScriptDirectory, upto: Any) -> tuple[str | None, str | None]:
    """(our newest revision that the host's revisions up to ``upto`` apply, the host revision
    that applies it); ``upto`` is a revision, a tuple of them, or None for base."""
    if upto in (None, "base", ()):
        return None, None
    found = [(target, script.revision)
             for script in script_dir.iterate_revisions(upto, "base")
             if (target := upgrade_target(Path(script.path))) is not None]
    return max(found, key=lambda f: _order(f[0])) if found else (None, None)


def applied_before_offline(ctx: MigrationContext) -> str | None:
    """Offline (``--sql``), where a run starts: what the host's history applied up to the
    start of the range (none without a start: the run begins at base)."""
    env = ctx.environment_context
    if ctx.script is None or env is None:
        return None
    return applied(ctx.script, env.get_starting_revision_argument())[0]


@dataclass(frozen=True)
class Written:
    path: Path
    revision: str
    down_revision: str | None
    before: str | None
    to: str


@dataclass(frozen=True)
class UpToDate:
    """What ``write_revision`` found instead of something to write: the host's history
    applies our schema up to ``before`` (in its revision ``where``) already."""

    before: str
    where: str | None
    to: str


@dataclass(frozen=True)
class HostWay:
    """How a host's Alembic history carries our schema: ``"branch"`` (our revisions in its
    version_locations: ``alembic upgrade heads``), ``"single"`` (a revision of its own applies
    it, up to ``applies``: ``alembic upgrade head``), or None (it does not)."""

    way: str | None
    applies: str | None = None


def _branch_way(cfg: Config, script_dir: ScriptDirectory) -> bool:
    listed = VERSION_LOCATION in (cfg.get_main_option("version_locations") or "")
    ours = VERSIONS_DIR.resolve()
    return listed or any(Path(s.path).resolve().parent == ours for s in script_dir.walk_revisions())


def host_way(cfg: Config) -> HostWay:
    """How the history ``cfg`` configures carries our schema (reads its files, no database)."""
    script_dir = ScriptDirectory.from_config(cfg)
    if _branch_way(cfg, script_dir):
        return HostWay("branch")
    applies, _ = applied(script_dir, tuple(script_dir.get_heads()) or None)
    return HostWay("single" if applies is not None else None, applies)


def _check_single_head_config(cfg: Config, script_dir: ScriptDirectory) -> None:
    if _branch_way(cfg, script_dir):
        raise InvalidArgument(
            f"{cfg.config_file_name} lists postjob_sa's revisions in version_locations (the "
            "branch way, upgraded with `alembic upgrade heads`): remove "
            f"{VERSION_LOCATION} from it to install our schema from a revision of your own"
        )


def write_revision(cfg: Config, to: str | None = None, message: str | None = None,
                   rev_id: str | None = None) -> Written | UpToDate:
    """Write the revision that brings our schema from what the host's history applies to
    ``to`` (default: this package's newest revision); :class:`UpToDate` when the history
    applies ``to`` (or a newer revision) already: nothing to write."""
    script_dir = ScriptDirectory.from_config(cfg)
    try:
        _check_single_head_config(cfg, script_dir)
        heads = script_dir.get_heads()
    except KeyError as exc:  # how Alembic reports a depends_on it cannot resolve
        raise InvalidArgument(
            f"your Alembic history refers to {exc.args[0]!r}, which it does not contain (a "
            f"depends_on = {exc.args[0]!r} left from the branch way? remove it)"
        ) from None
    if len(heads) > 1:
        raise InvalidArgument(
            f"your Alembic history has {len(heads)} heads ({', '.join(heads)}): "
            "merge them first (alembic merge heads)"
        )
    target = to or head_revision()
    if target not in revisions():
        raise InvalidArgument(
            f"unknown postjob revision {target!r} (this postjob_sa has {', '.join(revisions())})"
        )
    before, where = applied(script_dir, heads[0] if heads else None)
    if before is not None and _order(target) <= _order(before):
        return UpToDate(before, where, target)
    down = '"' + before + '"' if before else "None"
    script = script_dir.generate_revision(
        rev_id or new_rev_id(), message or f"postjob schema {target}", head="head",
        imports=IMPORT,
        upgrades=f'migrations.upgrade(to="{target}")',
        downgrades=f"migrations.downgrade(to={down})",
    )
    assert script is not None
    path = Path(script.path)
    if IMPORT not in path.read_text():
        path.unlink()
        raise InvalidArgument(
            f"{Path(script_dir.dir, 'script.py.mako')} has no ${{imports}} line, so the revision "
            'could not import postjob_sa: add a line `${imports if imports else ""}` to it'
        )
    return Written(path, script.revision, heads[0] if heads else None, before, target)
