"""postjob schema pj0008

Revision ID: 23df5c22f2bb
Revises: a709e11b25d7
Create Date: 2026-12-01 21:44:19.308486
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '23df5c22f2bb'
down_revision = 'a709e11b25d7'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0008")


def downgrade() -> None:
    migrations.downgrade(to="pj0007")
