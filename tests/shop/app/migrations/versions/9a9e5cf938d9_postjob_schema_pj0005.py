"""postjob schema pj0005

Revision ID: 9a9e5cf938d9
Revises: 4b5e394ca18a
Create Date: 2026-12-01 05:32:02.807355
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '9a9e5cf938d9'
down_revision = '4b5e394ca18a'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0005")


def downgrade() -> None:
    migrations.downgrade(to="pj0004")
