"""postjob schema pj0004

Revision ID: 4b5e394ca18a
Revises: 5c2d81e07a44
Create Date: 2026-12-01 02:38:03.149461
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '4b5e394ca18a'
down_revision = '5c2d81e07a44'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0004")


def downgrade() -> None:
    migrations.downgrade(to="pj0003")
