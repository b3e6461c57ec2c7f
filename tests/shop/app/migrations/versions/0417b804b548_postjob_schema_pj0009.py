"""postjob schema pj0009

Revision ID: 0417b804b548
Revises: 23df5c22f2bb
Create Date: 2026-12-02 08:23:45.563975
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '0417b804b548'
down_revision = '23df5c22f2bb'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0009")


def downgrade() -> None:
    migrations.downgrade(to="pj0008")
