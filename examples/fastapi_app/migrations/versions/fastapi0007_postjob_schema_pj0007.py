"""postjob schema pj0007

Revision ID: fastapi0007
Revises: fastapi0006
Create Date: 2026-12-01 11:06:04.672865
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0007'
down_revision = 'fastapi0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0007")


def downgrade() -> None:
    migrations.downgrade(to="pj0006")
