"""postjob schema pj0007

Revision ID: a709e11b25d7
Revises: 5053e053e126
Create Date: 2026-12-01 11:06:03.517121
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'a709e11b25d7'
down_revision = '5053e053e126'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0007")


def downgrade() -> None:
    migrations.downgrade(to="pj0006")
