"""postjob schema pj0010

Revision ID: 6e1d3c2b9a40
Revises: 0417b804b548
Create Date: 2026-12-02 11:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '6e1d3c2b9a40'
down_revision = '0417b804b548'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0010")


def downgrade() -> None:
    migrations.downgrade(to="pj0009")
