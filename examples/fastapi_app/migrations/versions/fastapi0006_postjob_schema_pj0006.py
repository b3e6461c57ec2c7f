"""postjob schema pj0006

Revision ID: fastapi0006
Revises: fastapi0005
Create Date: 2026-12-01 09:03:07.675781
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0006'
down_revision = 'fastapi0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0006")


def downgrade() -> None:
    migrations.downgrade(to="pj0005")
