"""postjob schema pj0011

Revision ID: fastapi0011
Revises: fastapi0010
Create Date: 2026-12-07 05:01:54.943915
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0011'
down_revision = 'fastapi0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0011")


def downgrade() -> None:
    migrations.downgrade(to="pj0010")
