"""postjob schema pj0010

Revision ID: fastapi0010
Revises: fastapi0009
Create Date: 2026-12-02 10:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0010'
down_revision = 'fastapi0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0010")


def downgrade() -> None:
    migrations.downgrade(to="pj0009")
