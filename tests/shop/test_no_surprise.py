"""No surprise in an app whose Alembic history owns the schema: ``postjob db status`` names
the command that app runs (``alembic upgrade head``, ``heads`` on the branch way), ``postjob
db revision`` with nothing to write is a success, and the app's own ``alembic downgrade`` of
the revision that installed our schema refuses to drop unfinished jobs unless told to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.util import CommandError
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from postjob_sa._migrations import head_revision
from tests.cli.test_cli_db import postjob
from tests.conftest import end_by_hand, url_string
from tests.shop.conftest import ADOPTION, FULFIL_JOB, UPGRADES, Shop, heads, installed, tables

HEAD = head_revision()
ALEMBIC = Path(sys.executable).with_name("alembic")
REFUSED = (
    "refusing to drop the postjob schema: {} unfinished job(s) (ready, processing, sleep or "
    "err) would be dropped with it. Let them finish or cancel them (postjob job cancel ID), "
    "or drop them too: downgrade with -x postjob_drop_unfinished=yes (alembic -x "
    "postjob_drop_unfinished=yes downgrade ...), or with POSTJOB_DROP_UNFINISHED=yes in the "
    "environment"
)


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


def _alembic(shop: Shop, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The app's own `alembic` command line, in its directory."""
    return subprocess.run([str(ALEMBIC), *args], cwd=shop.dir, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})}, check=False)


def _jobs(engine: Engine, *, unfinished: int, finished: int = 1) -> None:
    with Session(engine) as s:
        queue = JobQueue(s)
        for _ in range(finished):
            end_by_hand(s, queue.enqueue("shop.fulfil", 1).id, "ok")
        for _ in range(unfinished):
            queue.enqueue("shop.fulfil", 2)
        s.commit()


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.postjobs")).scalar_one())


def test_the_apps_downgrade_refuses_to_drop_unfinished_jobs_unless_told(
    shop: Shop, shop_db: Engine
) -> None:
    rev = _adopted_in_one_revision(shop)
    assert _alembic(shop, "upgrade", "head").returncode == 0
    _jobs(shop_db, unfinished=2)

    res = _alembic(shop, "downgrade", "-1")
    assert res.returncode != 0, (res.stdout, res.stderr)
    # Alembic's command line prints it as one line, on stdout
    assert res.stdout.strip().splitlines()[-1] == "FAILED: " + REFUSED.format(2), res.stdout
    assert heads(shop_db) == (rev,) and installed(shop_db) == HEAD and _count(shop_db) == 3
    with pytest.raises(CommandError, match=r"^refusing to drop the postjob schema: 2 unfinished"):
        command.downgrade(shop.cfg(), "-1")  # what `flask db downgrade` and scripts call
    with pytest.raises(CommandError, match="refusing"):
        command.downgrade(shop.cfg("postjob_drop_unfinished=no"), "-1")
    assert _count(shop_db) == 3

    # told so: the -x argument
    res = _alembic(shop, "-x", "postjob_drop_unfinished=yes", "downgrade", "-1")
    assert res.returncode == 0, res.stderr
    assert installed(shop_db) is None and "postjob" not in _schemas(shop_db)

    # or the environment variable
    assert _alembic(shop, "upgrade", "head").returncode == 0
    _jobs(shop_db, unfinished=1)
    res = _alembic(shop, "downgrade", "-1", env={"POSTJOB_DROP_UNFINISHED": "yes"})
    assert res.returncode == 0, res.stderr
    assert installed(shop_db) is None


def test_the_apps_downgrade_drops_finished_jobs_as_before(shop: Shop, shop_db: Engine) -> None:
    _adopted_in_one_revision(shop)
    command.upgrade(shop.cfg(), "head")
    _jobs(shop_db, unfinished=0, finished=2)
    command.downgrade(shop.cfg(), "-1")
    assert installed(shop_db) is None
    assert tables(shop_db, "public") >= {"alembic_version", "customers", "orders"}


def _schemas(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(text("SELECT nspname FROM pg_namespace"))}
