"""postjob schema pj0008

Revision ID: fastapi0008
Revises: fastapi0007
Create Date: 2026-12-01 21:44:18.664065
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0008'
down_revision = 'fastapi0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0008")


def downgrade() -> None:
    migrations.downgrade(to="pj0007")
