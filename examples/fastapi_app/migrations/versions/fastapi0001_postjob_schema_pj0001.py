"""postjob schema pj0001

Revision ID: fastapi0001
Revises: 
Create Date: 2026-11-30 19:46:10.913474
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0001")


def downgrade() -> None:
    migrations.downgrade(to=None)
