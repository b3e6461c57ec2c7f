"""postjob schema pj0011

Revision ID: 806e08af641d
Revises: 6e1d3c2b9a40
Create Date: 2026-12-07 05:01:50.205201
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '806e08af641d'
down_revision = '6e1d3c2b9a40'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0011")


def downgrade() -> None:
    migrations.downgrade(to="pj0010")
