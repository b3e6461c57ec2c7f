"""postjob schema pj0003

Revision ID: 5c2d81e07a44
Revises: 85a938654cea
Create Date: 2026-11-30 20:04:04.757440
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '5c2d81e07a44'
down_revision = '85a938654cea'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0003")


def downgrade() -> None:
    migrations.downgrade(to="pj0001")
