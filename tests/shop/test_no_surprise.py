"""No surprise in an app whose Alembic history owns the schema: ``postjob db status`` names
the command that app runs (``alembic upgrade head``, ``heads`` on the branch way), and
``postjob db revision`` with nothing to write is a success."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import Engine

from postjob_sa._migrations import head_revision
from tests.cli.test_cli_db import postjob
from tests.conftest import url_string
from tests.shop.conftest import ADOPTION, FULFIL_JOB, UPGRADES, Shop, heads, installed

HEAD = head_revision()


def _adopted_in_one_revision(shop: Shop) -> str:
    """The shop as the trial had it: one revision of its own (`postjob db revision`) installs
    our schema at the head, from nothing; the revision's id."""
    shop.forget(*reversed(UPGRADES), FULFIL_JOB, ADOPTION)
    res = postjob("db", "revision", "--rev-id", "shopjobs", cwd=shop.dir)
    assert res.returncode == 0, res.stderr
    return "shopjobs"


def _state(shop: Shop, engine: Engine, *args: str) -> str:
    res = postjob("db", "status", *args, url=url_string(engine.url), cwd=shop.dir)
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("state:")]
    return line


def test_status_names_the_apps_alembic_upgrade_where_its_history_carries_the_schema(
    shop: Shop, shop_db: Engine, tmp_path: Path
) -> None:
    rev = _adopted_in_one_revision(shop)
    # written, not applied yet: the app's own upgrade installs it, not postjob db migrate
    assert _state(shop, shop_db) == "state:     missing  (run: alembic upgrade head)"
    assert _state(shop, shop_db, "--alembic-ini", str(shop.ini)) == (
        "state:     missing  (run: alembic upgrade head)")
    # no Alembic configuration here: both ways
    res = postjob("db", "status", url=url_string(shop_db.url), cwd=tmp_path)
    assert ("state:     missing  (run: postjob db migrate, or in an app whose Alembic "
            "migrations install it: postjob db revision, then alembic upgrade head)"
            ) in res.stdout, res.stdout
    command.upgrade(shop.cfg(), "head")
    assert heads(shop_db) == (rev,) and installed(shop_db) == HEAD
    assert _state(shop, shop_db) == "state:     up to date"


def test_status_of_a_history_behind_this_postjob_sa_names_postjob_db_revision(
    shop: Shop, shop_db: Engine
) -> None:
    shop.forget(*reversed(UPGRADES))  # the shop adopted pj0001, and this release has more
    assert _state(shop, shop_db) == (
        "state:     missing  (run: postjob db revision, then alembic upgrade head)")
    command.upgrade(shop.cfg(), "head")
    assert _state(shop, shop_db) == (
        "state:     behind  (run: postjob db revision, then alembic upgrade head)")


def test_status_on_the_branch_way_names_upgrade_heads(shop: Shop, shop_db: Engine) -> None:
    shop.forget(*reversed(UPGRADES), FULFIL_JOB, ADOPTION)
    shop.edit(shop.ini, "path_separator = os", "path_separator = space\nversion_locations = "
              "%(here)s/migrations/versions postjob_sa:alembic/versions")
    assert _state(shop, shop_db) == "state:     missing  (run: alembic upgrade heads)"


def test_db_revision_with_nothing_to_write_succeeds(shop: Shop) -> None:
    """It runs idempotently in CI and Makefiles: nothing to do is success."""
    before = sorted(shop.versions.iterdir())
    res = postjob("db", "revision", cwd=shop.dir)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"nothing to write: your history already applies the postjob schema up to {HEAD} "
        f"(revision {UPGRADES[-1]}); apply it with `alembic upgrade head`\n")
    assert res.stderr == ""
    res = postjob("db", "revision", "--to", "pj0001", "--alembic-ini", str(shop.ini))
    assert res.returncode == 0 and res.stdout.startswith("nothing to write: "), res.stderr
    assert sorted(shop.versions.iterdir()) == before
