"""postjob schema pj0009

Revision ID: fastapi0009
Revises: fastapi0008
Create Date: 2026-12-02 08:23:43.212876
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0009'
down_revision = 'fastapi0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0009")


def downgrade() -> None:
    migrations.downgrade(to="pj0008")
