"""The branch way on the same existing history, step by step as docs/integrating.md says:
our revisions as a second version location, `alembic upgrade heads`, a branch label on the
shop's history, and `depends_on` for a revision that references our jobs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Engine

import postjob_sa
from postjob_sa import InvalidArgument, SchemaError
from postjob_sa._host_history import write_revision
from postjob_sa._migrations import head_revision
from tests.shop.conftest import (
    ADOPTION,
    BEFORE_ADOPTION,
    FULFIL_JOB,
    UPGRADES,
    Shop,
    heads,
    installed,
    place_orders,
    scalar,
    tables,
)

HEAD = head_revision()
BRANCH_WAY = (
    "path_separator = space\n"
    "version_locations = %(here)s/migrations/versions postjob_sa:alembic/versions"
)


def test_branch_way_on_the_existing_history(shop: Shop, shop_db: Engine) -> None:
    shop.forget(*reversed(UPGRADES), FULFIL_JOB, ADOPTION)  # the shop before it adopted postjob_sa
    command.upgrade(shop.cfg(), BEFORE_ADOPTION)
    place_orders(shop_db)

    shop.edit(shop.ini, "path_separator = os", BRANCH_WAY)
    shop.edit(shop.revision_file("shop0001"), "branch_labels = None", 'branch_labels = ("shop",)')
    # two heads now, the shop's and ours: `upgrade head` is ambiguous, `upgrade heads` is the way
    with pytest.raises(CommandError, match="Multiple head revisions"):
        command.upgrade(shop.cfg(), "head")
    command.upgrade(shop.cfg(), "heads")
    assert heads(shop_db) == (HEAD, BEFORE_ADOPTION)
    assert installed(shop_db) == HEAD

    # the next revision of the shop: on its own branch, and after ours (its FK needs our table)
    script = command.revision(shop.cfg(), message="order fulfil job", autogenerate=True,
                              head="shop@head", depends_on="postjob")
    assert not isinstance(script, list) and script is not None
    source = Path(script.path).read_text()
    assert "depends_on = 'postjob'" in source
    assert "op.drop_constraint(op.f('orders_fulfil_job_id_fkey')" in source  # named: it can go
    command.upgrade(shop.cfg(), "heads")
    # depends_on names our branch's first revision (which carries the label): our later
    # revisions stay a head of their own
    assert set(heads(shop_db)) == {script.revision, HEAD}
    command.check(shop.cfg())
    command.check(shop.cfg("compare=postjob"))

    # the shop's Alembic manages our schema: no second version table, no revision of ours
    with pytest.raises(SchemaError, match="managed by your app's Alembic"):
        postjob_sa.migrate(shop_db)
    assert "postjob_alembic_version" not in tables(shop_db)
    with pytest.raises(InvalidArgument, match="lists postjob_sa's revisions in version_locations"):
        write_revision(shop.cfg())

    # down to before the adoption: our branch, and the shop's revision that depends on it
    command.downgrade(shop.cfg(), "postjob@base")
    assert heads(shop_db) == (BEFORE_ADOPTION,)
    assert installed(shop_db) is None
    assert scalar(shop_db, "SELECT count(*) FROM orders") == 2

    command.upgrade(shop.cfg(), "heads")
    assert set(heads(shop_db)) == {script.revision, HEAD}
    assert installed(shop_db) == HEAD


@pytest.mark.skipif(os.pathsep != ":", reason="the pitfall of ':'-separated platforms")
def test_path_separator_os_loses_the_apps_own_revisions(shop: Shop) -> None:
    """Why the docs say `path_separator = space`: with `os`, the ':' of
    postjob_sa:alembic/versions splits the list, and neither the shop's revisions nor ours
    are found (the error then names whichever revision the database has)."""
    shop.edit(shop.ini, "path_separator = os",
              BRANCH_WAY.replace("path_separator = space", "path_separator = os"))
    assert ScriptDirectory.from_config(shop.cfg()).get_heads() == []
    shop.edit(shop.ini, "path_separator = os", "path_separator = space")
    assert sorted(ScriptDirectory.from_config(shop.cfg()).get_heads()) == sorted([UPGRADES[-1], HEAD])
